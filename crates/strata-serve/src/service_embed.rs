//! The embedding-run RPCs: registration, and top-k answers, triple scores and nearest
//! neighbours computed by the run's backend under the service's limits: ids per request
//! (`--max-ids`), answers per query (`--max-k`), the message limit (a reply's size is checked
//! before it is built), the working memory, and the call's deadline (a scan still running when
//! it passes stops with `DEADLINE_EXCEEDED`).

use std::time::{Duration, Instant};

use strata_graph::embedding_run::{EmbeddingRun, LinkQuery, Ranked};
use strata_io::progress::Progress;
use tonic::Request;

use crate::embeddings::embedding_error;
use crate::error::{Result, ServeError};
use crate::memory::{self, Reservation};
use crate::proto;
use crate::shared::{embedding_info, Core};

/// Bytes of one ranked answer on the wire besides its name: id and score varints, the known
/// flag, tags and lengths.
const RANKED_BYTES: u64 = 24;
/// Bytes a ranked answer holds while a call runs: the backend's `(node, score, known)`, its
/// heap entry and the reply's entry before names are added.
const RANKED_WORKING_BYTES: u64 = 64;

/// The deadline a client set on its call (`grpc-timeout`: digits and a unit of `H`, `M`, `S`,
/// `m`, `u` or `n`), as an instant; `None` without one or when it does not parse.
pub fn deadline_of<T>(req: &Request<T>) -> Option<Instant> {
    let text = req.metadata().get("grpc-timeout")?.to_str().ok()?;
    let (digits, unit) = text.split_at(text.len().checked_sub(1)?);
    let n: u64 = digits.parse().ok()?;
    let timeout = match unit {
        "H" => Duration::from_secs(n.saturating_mul(3600)),
        "M" => Duration::from_secs(n.saturating_mul(60)),
        "S" => Duration::from_secs(n),
        "m" => Duration::from_millis(n),
        "u" => Duration::from_micros(n),
        "n" => Duration::from_nanos(n),
        _ => return None,
    };
    Instant::now().checked_add(timeout)
}

/// Stops a backend's scan once the deadline has passed.
struct Deadline(Option<Instant>);

impl Progress for Deadline {
    fn stage(&self, _: &str, _: u64, _: u64) {}

    fn update(&self, _: u64, _: u64) -> bool {
        self.0.is_none_or(|d| Instant::now() < d)
    }

    fn message(&self, _: &str) {}
}

impl Deadline {
    /// Refuses a call whose deadline passed before its work started (waiting for the run).
    fn check(&self) -> Result<()> {
        if self.update(0, 0) {
            Ok(())
        } else {
            Err(embedding_error(
                strata_graph::embedding_run::EmbeddingError::Cancelled,
            ))
        }
    }
}

/// `EmbeddingRegister`.
pub fn register(core: &Core, r: proto::EmbeddingRegisterRequest) -> Result<proto::EmbeddingInfo> {
    if r.run_path.is_empty() {
        return Err(ServeError::InvalidArgument(
            "run_path: empty; give the run directory of `strata embed train` on the server".into(),
        ));
    }
    let memory = (r.memory > 0).then_some(r.memory);
    let path = core.limits.roots.resolve("run_path", &r.run_path)?;
    core.limits.roots.check_run_store("run_path", &path)?;
    let e = core
        .registry
        .register_embedding(&r.name, &path, &r.checkpoint, memory)?;
    Ok(embedding_info(&e))
}

/// `EmbeddingUnregister`.
pub fn unregister(core: &Core, r: proto::EmbeddingUnregisterRequest) -> Result<proto::Empty> {
    core.registry.unregister_embedding(&r.name)?;
    Ok(proto::Empty {})
}

/// How many nodes `refs` names, refusing none, both lists, or more than `--max-ids`.
fn node_count(core: &Core, refs: Option<&proto::NodeRefs>, field: &str) -> Result<usize> {
    let (names, ids) = refs.map_or((0, 0), |r| (r.names.len(), r.ids.len()));
    let n = match (names, ids) {
        (0, 0) => {
            return Err(ServeError::InvalidArgument(format!(
                "{field}: empty; give node names or ids"
            )))
        }
        (n, 0) | (0, n) => n,
        _ => {
            return Err(ServeError::InvalidArgument(format!(
                "{field}: give names or ids, not both"
            )))
        }
    };
    core.check_ids(n, field)?;
    Ok(n)
}

/// The node ids `refs` names (names looked up in the run's store).
fn node_ids(
    run: &dyn EmbeddingRun,
    refs: Option<&proto::NodeRefs>,
    field: &str,
) -> Result<Vec<u64>> {
    let refs = refs.expect("counted by node_count");
    if refs.ids.is_empty() {
        run.node_ids(field, &refs.names).map_err(embedding_error)
    } else {
        Ok(refs.ids.clone())
    }
}

/// The relation of each of `count` queries: `refs` holds one per query or one for all.
fn relation_ids(
    run: &dyn EmbeddingRun,
    refs: Option<&proto::RelationRefs>,
    count: usize,
) -> Result<Vec<u32>> {
    let empty = proto::RelationRefs::default();
    let refs = refs.unwrap_or(&empty);
    let ids = match (refs.names.is_empty(), refs.ids.is_empty()) {
        (true, true) => {
            return Err(ServeError::InvalidArgument(
                "relations: empty; give one relation name or id, or one per query".into(),
            ))
        }
        (false, false) => {
            return Err(ServeError::InvalidArgument(
                "relations: give names or ids, not both".into(),
            ))
        }
        (false, true) => run.relation_ids(&refs.names).map_err(embedding_error)?,
        (true, false) => refs.ids.clone(),
    };
    match ids.len() {
        1 => Ok(vec![ids[0]; count]),
        n if n == count => Ok(ids),
        n => Err(ServeError::InvalidArgument(format!(
            "relations: {n} given for {count} queries; give one for all or one per query"
        ))),
    }
}

/// Refuses `k` of 0 or above `--max-k`.
fn check_k(core: &Core, k: u32) -> Result<usize> {
    if k == 0 {
        return Err(ServeError::InvalidArgument(
            "k: 0; ask for at least one answer".into(),
        ));
    }
    if k as usize > core.limits.max_k {
        return Err(ServeError::ResourceExhausted(format!(
            "k: {k} answers per query; the limit is {} (--max-k)",
            core.limits.max_k
        )));
    }
    Ok(k as usize)
}

/// Refuses `queries x k` answers whose reply would be over the message limit even without
/// names, and reserves what their results hold while the call runs.
fn reserve_answers(core: &Core, queries: usize, k: usize, what: &str) -> Result<Reservation> {
    let answers = (queries as u64).saturating_mul(k as u64);
    memory::check_reply(answers.saturating_mul(RANKED_BYTES), core.max_message, what)?;
    core.working
        .reserve(answers.saturating_mul(RANKED_WORKING_BYTES), what)
}

/// The ranked lists of query nodes `nodes` as the reply's, with names: their size is checked
/// against the message limit and reserved (message and encoding) before they are built.
fn ranked_lists(
    core: &Core,
    run: &dyn EmbeddingRun,
    nodes: &[u64],
    lists: Vec<Vec<Ranked>>,
    what: &str,
) -> Result<(Vec<proto::RankedList>, Reservation)> {
    let mut ids: Vec<u64> = nodes.to_vec();
    ids.extend(lists.iter().flatten().map(|a| a.node));
    let names = run.node_names(&ids).map_err(embedding_error)?;
    let bytes: u64 = names.iter().map(|n| n.len() as u64 + RANKED_BYTES).sum();
    memory::check_reply(bytes, core.max_message, what)?;
    let held = core.working.reserve(bytes.saturating_mul(2), what)?;
    let mut names = names.into_iter();
    let mut heads: Vec<String> = names.by_ref().take(nodes.len()).collect();
    let out = nodes
        .iter()
        .zip(heads.iter_mut())
        .zip(lists)
        .map(|((&id, name), answers)| proto::RankedList {
            id,
            name: std::mem::take(name),
            answers: answers
                .into_iter()
                .map(|a| proto::RankedNode {
                    id: a.node,
                    name: names.next().expect("one name per answer"),
                    score: a.score,
                    known: a.known,
                })
                .collect(),
        })
        .collect();
    Ok((out, held))
}

/// `EmbeddingTopK`.
pub fn top_k(
    core: &Core,
    r: proto::EmbeddingTopKRequest,
    deadline: Option<Instant>,
) -> Result<proto::EmbeddingTopKResponse> {
    let served = core.registry.embeddings.get(&r.run)?;
    let count = node_count(core, r.nodes.as_ref(), "nodes")?;
    let k = check_k(core, r.k)?;
    let _answers = reserve_answers(core, count, k, "EmbeddingTopK")?;
    let deadline = Deadline(deadline);
    let mut run = served.lock();
    deadline.check()?;
    let nodes = node_ids(run.as_ref(), r.nodes.as_ref(), "nodes")?;
    let relations = relation_ids(run.as_ref(), r.relations.as_ref(), count)?;
    let queries: Vec<LinkQuery> = nodes
        .iter()
        .zip(&relations)
        .map(|(&node, &relation)| LinkQuery {
            node,
            relation,
            head: r.predict_heads,
        })
        .collect();
    let lists = run
        .top_k(&queries, k, r.filtered, &deadline)
        .map_err(embedding_error)?;
    let (results, _reply) = ranked_lists(core, run.as_ref(), &nodes, lists, "EmbeddingTopK")?;
    Ok(proto::EmbeddingTopKResponse {
        results,
        epoch: served.info.epoch,
    })
}

/// `EmbeddingScore`.
pub fn score(
    core: &Core,
    r: proto::EmbeddingScoreRequest,
    deadline: Option<Instant>,
) -> Result<proto::EmbeddingScoreResponse> {
    let served = core.registry.embeddings.get(&r.run)?;
    let count = node_count(core, r.heads.as_ref(), "heads")?;
    let tails = node_count(core, r.tails.as_ref(), "tails")?;
    if tails != count {
        return Err(ServeError::InvalidArgument(format!(
            "tails: {tails} given for {count} heads; give one tail per head"
        )));
    }
    let reply = memory::u64s_bytes(count as u64);
    memory::check_reply(reply, core.max_message, "EmbeddingScore")?;
    let _held = core.working.reserve(
        (count as u64).saturating_mul(RANKED_WORKING_BYTES),
        "EmbeddingScore",
    )?;
    let deadline = Deadline(deadline);
    let mut run = served.lock();
    deadline.check()?;
    let heads = node_ids(run.as_ref(), r.heads.as_ref(), "heads")?;
    let relations = relation_ids(run.as_ref(), r.relations.as_ref(), count)?;
    let tails = node_ids(run.as_ref(), r.tails.as_ref(), "tails")?;
    let triples: Vec<(u64, u32, u64)> = heads
        .iter()
        .zip(&relations)
        .zip(&tails)
        .map(|((&h, &rel), &t)| (h, rel, t))
        .collect();
    let scores = run.score(&triples, &deadline).map_err(embedding_error)?;
    Ok(proto::EmbeddingScoreResponse {
        scores,
        epoch: served.info.epoch,
    })
}

/// `EmbeddingNeighbors`.
pub fn neighbors(
    core: &Core,
    r: proto::EmbeddingNeighborsRequest,
    deadline: Option<Instant>,
) -> Result<proto::EmbeddingNeighborsResponse> {
    let served = core.registry.embeddings.get(&r.run)?;
    let count = node_count(core, r.nodes.as_ref(), "nodes")?;
    let k = check_k(core, r.k)?;
    let _answers = reserve_answers(core, count, k, "EmbeddingNeighbors")?;
    let metric = if r.metric.is_empty() {
        "model"
    } else {
        &r.metric
    };
    let deadline = Deadline(deadline);
    let mut run = served.lock();
    deadline.check()?;
    let nodes = node_ids(run.as_ref(), r.nodes.as_ref(), "nodes")?;
    let (metric, lists) = run
        .neighbors(&nodes, k, metric, r.any_type, &deadline)
        .map_err(embedding_error)?;
    let (results, _reply) = ranked_lists(core, run.as_ref(), &nodes, lists, "EmbeddingNeighbors")?;
    Ok(proto::EmbeddingNeighborsResponse {
        metric,
        results,
        epoch: served.info.epoch,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_timeout(value: &str) -> Request<()> {
        let mut req = Request::new(());
        req.metadata_mut()
            .insert("grpc-timeout", value.parse().unwrap());
        req
    }

    #[test]
    fn a_deadline_is_read_from_grpc_timeout() {
        let now = Instant::now();
        let in_5s = deadline_of(&with_timeout("5S")).unwrap();
        assert!(in_5s >= now + Duration::from_secs(5) && in_5s < now + Duration::from_secs(6));
        let in_200ms = deadline_of(&with_timeout("200m")).unwrap();
        assert!(in_200ms < now + Duration::from_secs(1));
        assert!(deadline_of(&with_timeout("3H")).unwrap() > now + Duration::from_secs(3 * 3599));
        for bad in ["5", "S", "5X", "-1S"] {
            assert_eq!(deadline_of(&with_timeout(bad)), None, "{bad}");
        }
        assert_eq!(deadline_of(&Request::new(())), None);
    }

    #[test]
    fn a_passed_deadline_stops_a_scan() {
        assert!(Deadline(None).update(1, 1) && Deadline(None).check().is_ok());
        let later = Deadline(Some(Instant::now() + Duration::from_secs(60)));
        assert!(later.update(1, 1));
        let passed = Deadline(Some(Instant::now() - Duration::from_millis(1)));
        assert!(!passed.update(1, 1));
        let e = passed.check().unwrap_err();
        assert!(matches!(e, ServeError::DeadlineExceeded(_)), "{e}");
    }
}
