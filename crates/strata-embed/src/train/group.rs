//! The group of processes a training job runs in, as its coordinator sees it: a rank in a
//! world, barriers, a gather and a broadcast. A single-process job is a group of one
//! ([`LocalCluster`]), so the coordinator's choreography (rank 0 creates the run before the
//! others open it, rank 0 commits, the others follow) reads the same with or without torchrun.
//! A distributed job's group is its [`Cluster`], which also schedules its buckets.

use crate::error::Result;
use crate::train::dist::Cluster;

/// The collective operations the coordinator needs from its group.
pub trait Group {
    fn rank(&self) -> usize;
    fn world_size(&self) -> usize;
    /// Waits until every rank arrives; `what` names the point in errors.
    fn barrier(&mut self, what: &str) -> Result<()>;
    /// Every rank's `mine`, in rank order, on rank 0; empty on the other ranks.
    fn gather(&mut self, mine: String) -> Result<Vec<String>>;
    /// Rank 0's `text` on every rank (what the other ranks pass is ignored).
    fn broadcast(&mut self, text: String) -> Result<String>;

    /// Whether this rank leads the group (rank 0: it creates, validates and commits the run).
    fn leads(&self) -> bool {
        self.rank() == 0
    }
}

/// A single-machine cluster of one: rank 0 of a world of one, whose collectives return at
/// once with its own contribution.
#[derive(Debug, Default, Clone, Copy)]
pub struct LocalCluster;

impl Group for LocalCluster {
    fn rank(&self) -> usize {
        0
    }

    fn world_size(&self) -> usize {
        1
    }

    fn barrier(&mut self, _what: &str) -> Result<()> {
        Ok(())
    }

    fn gather(&mut self, mine: String) -> Result<Vec<String>> {
        Ok(vec![mine])
    }

    fn broadcast(&mut self, text: String) -> Result<String> {
        Ok(text)
    }
}

/// A distributed job's group: its [`Cluster`]'s collectives.
pub struct Ranks<'a>(pub &'a mut dyn Cluster);

impl Group for Ranks<'_> {
    fn rank(&self) -> usize {
        self.0.rank()
    }

    fn world_size(&self) -> usize {
        self.0.world_size()
    }

    fn barrier(&mut self, what: &str) -> Result<()> {
        self.0.barrier(what)
    }

    fn gather(&mut self, mine: String) -> Result<Vec<String>> {
        self.0.gather(mine)
    }

    fn broadcast(&mut self, text: String) -> Result<String> {
        self.0.broadcast(text)
    }
}

/// Runs `f` on the leader before the other ranks (they wait at a barrier named `what` until
/// it is done), then on the others: rank 0 creates or resumes the run before the others open
/// it. A leader whose `f` fails returns the error without reaching the barrier.
pub fn leader_first<T>(
    group: &mut dyn Group,
    what: &str,
    f: impl FnOnce() -> Result<T>,
) -> Result<T> {
    if !group.leads() {
        group.barrier(what)?;
    }
    let out = f()?;
    if group.leads() {
        group.barrier(what)?;
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::cell::RefCell;
    use std::rc::Rc;

    use super::*;
    use crate::error::EmbedError;

    /// A rank of a group of two that records its barriers (and, through the same log, the
    /// work it is given).
    struct Recorder {
        rank: usize,
        log: Rc<RefCell<Vec<&'static str>>>,
    }

    impl Group for Recorder {
        fn rank(&self) -> usize {
            self.rank
        }
        fn world_size(&self) -> usize {
            2
        }
        fn barrier(&mut self, _: &str) -> Result<()> {
            self.log.borrow_mut().push("barrier");
            Ok(())
        }
        fn gather(&mut self, mine: String) -> Result<Vec<String>> {
            Ok(vec![mine])
        }
        fn broadcast(&mut self, text: String) -> Result<String> {
            Ok(text)
        }
    }

    /// What rank `rank` does around work that fails when `fail`, and whether it succeeded.
    fn record(rank: usize, fail: bool) -> (Vec<&'static str>, bool) {
        let log = Rc::new(RefCell::new(Vec::new()));
        let mut g = Recorder {
            rank,
            log: log.clone(),
        };
        let out = leader_first(&mut g, "created", || {
            log.borrow_mut().push("work");
            match fail {
                true => Err(EmbedError::Config("bad".into())),
                false => Ok(()),
            }
        });
        let events = log.borrow().clone();
        (events, out.is_ok())
    }

    #[test]
    fn the_leader_works_before_the_barrier_and_the_others_after_it() {
        assert_eq!(record(0, false), (vec!["work", "barrier"], true));
        assert_eq!(record(1, false), (vec!["barrier", "work"], true));
        // A leader whose work failed does not reach the barrier.
        assert_eq!(record(0, true), (vec!["work"], false));
        assert_eq!(record(1, true), (vec!["barrier", "work"], false));
    }

    #[test]
    fn a_local_cluster_is_a_world_of_one() {
        let mut local = LocalCluster;
        assert!(local.leads());
        assert_eq!(local.world_size(), 1);
        assert_eq!(local.gather("mine".into()).unwrap(), ["mine"]);
        assert_eq!(local.broadcast("commit".into()).unwrap(), "commit");
        local.barrier("any").unwrap();
    }
}
