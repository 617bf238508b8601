//! End-to-end tests of the rooms together: stores converted from text, trained, evaluated,
//! exported and used to start incremental runs.

mod all_entities;
mod incremental;
mod loss_options;
mod schedules;
mod train_eval;
