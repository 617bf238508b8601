//! `strata check`'s checks of format 2 (docs/formats.md, "Version 2"): every edge's endpoints
//! inside its edge type's source and destination ranges; in CSR and CSC, each edge id in range
//! and each node's segment ordered by (edge type, edge id); the payload columns (`*_eid`,
//! `*_etype`, `*_weights`, `*_times`) holding exactly the train edges with their attributes;
//! weights and features finite; per-type labels and node splits in range.
//!
//! CSR and CSC are compared with the train edges through an order-free signature (the count and
//! the wrapping sum of a 64-bit hash of each edge's `(src, dst, eid, etype, weight bits, time)`),
//! so memory stays bounded whatever the store's size; see the module doc of [`crate::check`].

use strata_io::progress::Progress;

use crate::checked::{finite, name_table, Checked, Stream};
use crate::error::Result;
use crate::ids::{Field, IdCheck, IndptrCheck};
use crate::manifest::{BagInfo, Manifest};
use crate::rng::derive;
use crate::store::Store;

/// Key of the payload hash.
const PAYLOAD_HASH_KEY: u64 = 0x7061_796c_6f61_6473;

/// Count and hash sum of a multiset of topology edges with their payload.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
struct PayloadSig {
    count: u64,
    sum: u64,
}

impl PayloadSig {
    fn add(&mut self, src: i64, dst: i64, eid: i64, etype: i64, weight_bits: i64, time: i64) {
        let mut h = PAYLOAD_HASH_KEY;
        for v in [src, dst, eid, etype, weight_bits, time] {
            h = derive(h, v as u64);
        }
        self.count += 1;
        self.sum = self.sum.wrapping_add(h);
    }
}

/// The optional payload columns of one edge array or one CSR/CSC side, read in lockstep.
struct Columns {
    etype: Option<Stream>,
    weights: Option<Stream>,
    times: Option<Stream>,
}

impl Columns {
    fn open(
        checked: &mut Checked,
        store: &Store,
        etype: Option<&str>,
        weights: Option<&str>,
        times: Option<&str>,
    ) -> Result<Columns> {
        let mut open =
            |name: Option<&str>| name.map(|n| Stream::open(checked, store, n)).transpose();
        Ok(Columns {
            etype: open(etype)?,
            weights: open(weights)?,
            times: open(times)?,
        })
    }

    /// The next edge's (etype, weight bits, time); absent columns read as 0. Weights are
    /// float32 read as int32 bit patterns.
    fn next(&mut self) -> Result<(i64, i64, i64)> {
        let one = |s: &mut Option<Stream>| -> Result<i64> {
            Ok(match s {
                Some(s) => s.next()?.unwrap_or(0),
                None => 0,
            })
        };
        Ok((
            one(&mut self.etype)?,
            one(&mut self.weights)? as u32 as i64,
            one(&mut self.times)?,
        ))
    }
}

/// Checks format 2's arrays of `store` (nothing for a version-1 store).
pub(crate) fn format2(store: &Store, checked: &mut Checked, progress: &dyn Progress) -> Result<()> {
    let m = store.manifest();
    if m.required_version() < 2 {
        return Ok(());
    }
    let splits: Vec<String> = m.graph.num_edges.keys().cloned().collect();
    let attrs = m.edge_attributes.clone().unwrap_or_default();
    if attrs.weights {
        for split in &splits {
            finite(store, checked, &format!("edge_weights_{split}"), progress)?;
        }
        finite(store, checked, "csr_weights", progress)?;
        if !aliased(store, "csr_weights", "csc_weights")? {
            finite(store, checked, "csc_weights", progress)?;
        }
    }
    if attrs.features.is_some() {
        finite(store, checked, "edge_features_train", progress)?;
    }
    if m.is_typed() {
        for split in &splits {
            endpoint_types(store, checked, split)?;
        }
    }
    let edges = edge_signature(store, checked)?;
    for dir in ["csr", "csc"] {
        if dir == "csc" && aliased(store, "csr_eid", "csc_eid")? {
            continue;
        }
        let side = side_signature(store, checked, dir)?;
        if side != edges {
            let file = store.require(&format!("{dir}_eid"))?.file.clone();
            checked.problems.add(
                &file,
                None,
                format!(
                    "{dir}_indices, {dir}_eid and the {dir} attribute columns hold {} edges that differ from edges_train and its attribute arrays ({} edges): an edge's neighbour, id, type, weight or time does not match its row in the edge list",
                    side.count, edges.count
                ),
            );
        }
    }
    per_type(store, checked, m, progress)
}

fn aliased(store: &Store, a: &str, b: &str) -> Result<bool> {
    Ok(store.require(a)?.file == store.require(b)?.file)
}

/// Every edge of `edges_SPLIT` has its source in its edge type's source range and its
/// destination in its destination range (out-of-range ids are reported by the id checks).
fn endpoint_types(store: &Store, checked: &mut Checked, split: &str) -> Result<()> {
    let m = store.manifest();
    let name = format!("edges_{split}");
    let file = store.require(&name)?.file.clone();
    let mut edges = Stream::open(checked, store, &name)?;
    let n = m.graph.num_nodes as i64;
    let mut row = 0u64;
    while let Some(src) = edges.next()? {
        let (Some(rel), Some(dst)) = (edges.next()?, edges.next()?) else {
            break;
        };
        if let Some(et) = m.edge_types.get(rel.max(0) as usize).filter(|_| rel >= 0) {
            for (role, v, t) in [("src", src, et.src_type), ("dst", dst, et.dst_type)] {
                let nt = &m.node_types[t as usize];
                if (0..n).contains(&v) && !(nt.offset..nt.offset + nt.count).contains(&(v as u64)) {
                    let actual = m
                        .node_type_of(v as u64)
                        .map_or("?", |i| m.node_types[i].name.as_str());
                    checked.problems.add(
                        &file,
                        Some(row),
                        format!(
                            "{file} row {row}: {role} {v} is a '{actual}' node, but edge type {rel} ('{}') takes '{}' nodes (ids {}..{})",
                            et.relation,
                            nt.name,
                            nt.offset,
                            nt.offset + nt.count
                        ),
                    );
                }
            }
        }
        row += 1;
    }
    Ok(())
}

/// The signature of the train edges with their ids and attributes (both directions of each
/// when the store is symmetrized).
fn edge_signature(store: &Store, checked: &mut Checked) -> Result<PayloadSig> {
    let m = store.manifest();
    let attrs = m.edge_attributes.clone().unwrap_or_default();
    let cols = m.graph.edge_columns().len();
    let mut edges = Stream::open(checked, store, "edges_train")?;
    let mut payload = Columns::open(
        checked,
        store,
        None,
        attrs.weights.then_some("edge_weights_train"),
        attrs.times.then_some("edge_times_train"),
    )?;
    let mut sig = PayloadSig::default();
    let mut eid = 0i64;
    let mut row = Vec::new();
    loop {
        edges.take(cols, &mut row)?;
        if row.len() < cols {
            break;
        }
        let etype = if m.is_typed() { row[1] } else { 0 };
        let (_, w, t) = payload.next()?;
        let (u, v) = (row[0], row[cols - 1]);
        sig.add(u, v, eid, etype, w, t);
        if m.graph.symmetrized {
            sig.add(v, u, eid, etype, w, t);
        }
        eid += 1;
    }
    Ok(sig)
}

/// Checks one side's edge ids and segment order, and returns the signature of its edges.
fn side_signature(store: &Store, checked: &mut Checked, dir: &str) -> Result<PayloadSig> {
    let m = store.manifest();
    let attrs = m.edge_attributes.clone().unwrap_or_default();
    let typed = m.is_typed();
    let (etype_name, weights_name, times_name) = (
        format!("{dir}_etype"),
        format!("{dir}_weights"),
        format!("{dir}_times"),
    );
    let eid_file = store.require(&format!("{dir}_eid"))?.file.clone();
    let etype_file = typed
        .then(|| store.require(&etype_name).map(|i| i.file.clone()))
        .transpose()?;
    let mut indptr = Stream::open(checked, store, &format!("{dir}_indptr"))?;
    let mut indices = Stream::open(checked, store, &format!("{dir}_indices"))?;
    let mut eids = Stream::open(checked, store, &format!("{dir}_eid"))?;
    let mut payload = Columns::open(
        checked,
        store,
        typed.then_some(etype_name.as_str()),
        attrs.weights.then_some(weights_name.as_str()),
        attrs.times.then_some(times_name.as_str()),
    )?;
    let train = m.graph.num_edges.get("train").copied().unwrap_or(0) as i64;
    let mut sig = PayloadSig::default();
    let mut start = indptr.next()?.unwrap_or(0);
    let mut k = start.max(0) as u64;
    for node in 0..m.graph.num_nodes as i64 {
        let Some(end) = indptr.next()? else { break };
        let mut prev: Option<(i64, i64)> = None;
        for _ in start..end {
            let (Some(nbr), Some(eid)) = (indices.next()?, eids.next()?) else {
                return Ok(sig);
            };
            let (etype, w, t) = payload.next()?;
            if !(0..train).contains(&eid) {
                checked.problems.add(
                    &eid_file,
                    Some(k),
                    format!("{eid_file} row {k}: edge id {eid} is out of range [0, {train})"),
                );
            }
            if let (Some(file), Some(p)) = (&etype_file, prev) {
                if (etype, eid) <= p {
                    checked.problems.add(
                        file,
                        Some(k),
                        format!(
                            "{file} row {k}: node {node}'s neighbours are not ordered by (edge type, edge id): ({etype}, {eid}) follows ({}, {})",
                            p.0, p.1
                        ),
                    );
                }
            }
            prev = Some((etype, eid));
            let (src, dst) = if dir == "csr" {
                (node, nbr)
            } else {
                (nbr, node)
            };
            sig.add(src, dst, eid, etype, w, t);
            k += 1;
        }
        start = end;
    }
    Ok(sig)
}

/// Per node type: labels in `[-1, num_classes)`, node splits in `[0, count)` (local ids),
/// features finite.
fn per_type(
    store: &Store,
    checked: &mut Checked,
    m: &Manifest,
    progress: &dyn Progress,
) -> Result<()> {
    for (i, nt) in m.node_types.iter().enumerate() {
        if let Some(l) = &nt.labels {
            let name = format!("labels_t{i}");
            let check = IdCheck::new(
                store.path(),
                &store.require(&name)?.file,
                vec![Field::new(
                    "label",
                    -1,
                    l.num_classes.min(i64::MAX as u64) as i64,
                )],
            );
            checked.ids(store, &name, check, progress)?;
        }
        for split in nt.node_splits.keys() {
            let name = format!("node_{split}_t{i}");
            let check = IdCheck::new(
                store.path(),
                &store.require(&name)?.file,
                vec![Field::new(
                    &format!("local id of a '{}' node", nt.name),
                    0,
                    nt.count.min(i64::MAX as u64) as i64,
                )],
            );
            checked.ids(store, &name, check, progress)?;
        }
        if nt.features.is_some() {
            finite(store, checked, &format!("features_t{i}"), progress)?;
        }
        if let Some(b) = &nt.bags {
            bags(store, checked, i, b, progress)?;
        }
    }
    Ok(())
}

/// A node type's feature bags: offsets from 0 to the entries, never decreasing; feature ids
/// in `[0, num_features)`; feature names sorted and unique.
fn bags(
    store: &Store,
    checked: &mut Checked,
    t: usize,
    b: &BagInfo,
    progress: &dyn Progress,
) -> Result<()> {
    let offsets = format!("bag_offsets_t{t}");
    let file = store.require(&offsets)?.file.clone();
    let mut check = IndptrCheck::array(store, &offsets, b.entries)?;
    checked.ints(store, &offsets, progress, |problems, vals| {
        check.scan(vals, |row, msg| problems.add(&file, Some(row), msg))
    })?;
    if let Some((row, msg)) = check.end_problem() {
        checked.problems.add(&file, Some(row), msg);
    }
    let features = format!("bag_features_t{t}");
    let check = IdCheck::new(
        store.path(),
        &store.require(&features)?.file,
        vec![Field::new(
            "feature id",
            0,
            b.num_features.min(i64::MAX as u64) as i64,
        )],
    );
    checked.ids(store, &features, check, progress)?;
    name_table(store, checked, &format!("bag_names_t{t}"), progress)
}
