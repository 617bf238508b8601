//! The table and its neighbours in memory and on disk: node partitions and edge buckets, the table file, the partition buffer, negative banks, relation rows, entity types and the epoch's background I/O.

pub mod bank;
pub mod buffer;
pub mod entity_types;
pub mod epoch_io;
pub mod layout;
pub mod partitioning;
pub mod relations;
pub mod shared;
pub mod table;
