//! The table and its neighbours in memory and on disk: node partitions and edge buckets, the edges and partitions kept in memory, the table file, the partition buffer, negative banks, relation rows, entity types, the epoch's background I/O and its table written behind.

pub(crate) mod bank;
pub(crate) mod buffer;
pub(crate) mod edge_cache;
pub(crate) mod entity_types;
pub(crate) mod epoch_io;
pub(crate) mod layout;
pub(crate) mod partition_cache;
pub(crate) mod partitioning;
pub(crate) mod relations;
pub(crate) mod shared;
pub(crate) mod table;
pub(crate) mod write_behind;
