//! Graph mutations as the write-ahead log records them: internal vertex ids, already checked
//! against the graph, so replaying a record can never fail.

use crate::error::{Result, ServeError};

/// One acknowledged change to a served graph. Ids are internal (after the registration's
/// re-ordering); feature rows are f32, `dim` per vertex.
#[derive(Debug, Clone, PartialEq)]
pub enum Mutation {
    /// New vertices `first..first + count`, with their feature rows (`count * dim` values).
    AddVertices {
        first: u32,
        count: u32,
        features: Vec<f32>,
    },
    /// Removed vertices lose every edge in and out; their ids are never reused.
    RemoveVertices { ids: Vec<u32> },
    /// New feature rows (`ids.len() * dim` values).
    UpdateVertices { ids: Vec<u32>, features: Vec<f32> },
    /// Edges `src[i] -> dst[i]`.
    AddEdges { src: Vec<u32>, dst: Vec<u32> },
    /// Every copy of each edge `src[i] -> dst[i]`.
    RemoveEdges { src: Vec<u32>, dst: Vec<u32> },
    /// Mutations applied in order as one: a batch is a single log record, so replay after a
    /// crash (which keeps or cuts whole records) applies all of them or none. Never nested.
    Batch(Vec<Mutation>),
}

const ADD_VERTICES: u8 = 1;
const REMOVE_VERTICES: u8 = 2;
const UPDATE_VERTICES: u8 = 3;
const ADD_EDGES: u8 = 4;
const REMOVE_EDGES: u8 = 5;
const BATCH: u8 = 6;

impl Mutation {
    /// The log payload: a tag byte, then little-endian u32 counts and values; a batch is its
    /// count, then each mutation's length and payload.
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.encode_into(&mut out);
        out
    }

    fn encode_into(&self, out: &mut Vec<u8>) {
        let u32s = |out: &mut Vec<u8>, v: &[u32]| {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            v.iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes()));
        };
        let f32s = |out: &mut Vec<u8>, v: &[f32]| {
            out.extend_from_slice(&(v.len() as u32).to_le_bytes());
            out.extend_from_slice(bytemuck::cast_slice(v));
        };
        match self {
            Mutation::AddVertices {
                first,
                count,
                features,
            } => {
                out.push(ADD_VERTICES);
                out.extend_from_slice(&first.to_le_bytes());
                out.extend_from_slice(&count.to_le_bytes());
                f32s(out, features);
            }
            Mutation::RemoveVertices { ids } => {
                out.push(REMOVE_VERTICES);
                u32s(out, ids);
            }
            Mutation::UpdateVertices { ids, features } => {
                out.push(UPDATE_VERTICES);
                u32s(out, ids);
                f32s(out, features);
            }
            Mutation::AddEdges { src, dst } | Mutation::RemoveEdges { src, dst } => {
                out.push(if matches!(self, Mutation::AddEdges { .. }) {
                    ADD_EDGES
                } else {
                    REMOVE_EDGES
                });
                u32s(out, src);
                u32s(out, dst);
            }
            Mutation::Batch(ms) => {
                out.push(BATCH);
                out.extend_from_slice(&(ms.len() as u32).to_le_bytes());
                for m in ms {
                    let at = out.len();
                    out.extend_from_slice(&[0; 4]);
                    m.encode_into(out);
                    let len = (out.len() - at - 4) as u32;
                    out[at..at + 4].copy_from_slice(&len.to_le_bytes());
                }
            }
        }
    }

    /// Parses a payload written by [`Mutation::encode`]; the log's checksum has already
    /// vouched for the bytes, so a failure here means a log from another format.
    pub fn decode(bytes: &[u8]) -> Result<Mutation> {
        let mut r = Reader { bytes, at: 0 };
        let tag = r.take(1)?[0];
        let m = match tag {
            ADD_VERTICES => Mutation::AddVertices {
                first: r.u32()?,
                count: r.u32()?,
                features: r.f32s()?,
            },
            REMOVE_VERTICES => Mutation::RemoveVertices { ids: r.u32s()? },
            UPDATE_VERTICES => Mutation::UpdateVertices {
                ids: r.u32s()?,
                features: r.f32s()?,
            },
            ADD_EDGES => Mutation::AddEdges {
                src: r.u32s()?,
                dst: r.u32s()?,
            },
            REMOVE_EDGES => Mutation::RemoveEdges {
                src: r.u32s()?,
                dst: r.u32s()?,
            },
            BATCH => {
                let n = r.u32()? as usize;
                // Each mutation takes at least 5 bytes: a count this record cannot hold is
                // refused before anything is allocated for it.
                if n > (bytes.len() - r.at) / 5 {
                    return Err(bad(format!(
                        "a batch of {n} mutations in a record too short for them"
                    )));
                }
                let mut ms = Vec::with_capacity(n);
                for _ in 0..n {
                    let len = r.u32()? as usize;
                    let m = Mutation::decode(r.take(len)?)?;
                    if matches!(m, Mutation::Batch(_)) {
                        return Err(bad("a batch inside a batch".into()));
                    }
                    ms.push(m);
                }
                Mutation::Batch(ms)
            }
            other => return Err(bad(format!("unknown record type {other}"))),
        };
        if r.at != bytes.len() {
            return Err(bad(format!(
                "{} trailing bytes after a record",
                bytes.len() - r.at
            )));
        }
        Ok(m)
    }
}

fn bad(msg: String) -> ServeError {
    ServeError::FailedPrecondition(format!("write-ahead log: {msg}"))
}

struct Reader<'a> {
    bytes: &'a [u8],
    at: usize,
}

impl Reader<'_> {
    fn take(&mut self, n: usize) -> Result<&[u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.bytes.len());
        let end = end.ok_or_else(|| bad("record ends early".into()))?;
        let s = &self.bytes[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u32(&mut self) -> Result<u32> {
        Ok(u32::from_le_bytes(self.take(4)?.try_into().unwrap()))
    }

    fn u32s(&mut self) -> Result<Vec<u32>> {
        self.words(u32::from_le_bytes)
    }

    fn f32s(&mut self) -> Result<Vec<f32>> {
        self.words(f32::from_le_bytes)
    }

    /// A count, then that many 4-byte little-endian values.
    fn words<T>(&mut self, parse: fn([u8; 4]) -> T) -> Result<Vec<T>> {
        let n = self.u32()? as usize;
        let raw = self.take(
            n.checked_mul(4)
                .ok_or_else(|| bad("count overflows".into()))?,
        )?;
        Ok(raw
            .chunks_exact(4)
            .map(|c| parse(c.try_into().unwrap()))
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// A mutation of any kind, batches of up to four of the others included.
    fn mutation() -> impl Strategy<Value = Mutation> {
        prop_oneof![
            single(),
            proptest::collection::vec(single(), 0..4).prop_map(Mutation::Batch),
        ]
    }

    fn single() -> impl Strategy<Value = Mutation> {
        let ids = proptest::collection::vec(any::<u32>(), 0..20);
        let vals = proptest::collection::vec(-1e6f32..1e6, 0..40);
        prop_oneof![
            (any::<u32>(), any::<u32>(), vals.clone()).prop_map(|(first, count, features)| {
                Mutation::AddVertices {
                    first,
                    count,
                    features,
                }
            }),
            ids.clone().prop_map(|ids| Mutation::RemoveVertices { ids }),
            (ids.clone(), vals)
                .prop_map(|(ids, features)| Mutation::UpdateVertices { ids, features }),
            (ids.clone(), ids.clone()).prop_map(|(src, dst)| Mutation::AddEdges { src, dst }),
            (ids.clone(), ids).prop_map(|(src, dst)| Mutation::RemoveEdges { src, dst }),
        ]
    }

    proptest! {
        #[test]
        fn round_trips(m in mutation()) {
            prop_assert_eq!(Mutation::decode(&m.encode()).unwrap(), m);
        }

        #[test]
        fn truncated_records_are_refused(m in mutation(), cut in 0usize..1000) {
            let bytes = m.encode();
            let cut = cut % bytes.len();
            prop_assert!(Mutation::decode(&bytes[..cut]).is_err());
        }
    }

    #[test]
    fn nested_batches_and_impossible_counts_are_refused() {
        let inner = Mutation::Batch(vec![Mutation::RemoveVertices { ids: vec![1] }]);
        let nested = Mutation::Batch(vec![inner]).encode();
        let e = Mutation::decode(&nested).unwrap_err().to_string();
        assert!(e.contains("a batch inside a batch"), "{e}");
        let mut huge = vec![BATCH];
        huge.extend_from_slice(&u32::MAX.to_le_bytes());
        let e = Mutation::decode(&huge).unwrap_err().to_string();
        assert!(e.contains("too short"), "{e}");
    }

    #[test]
    fn unknown_tags_and_trailing_bytes_are_refused() {
        assert!(Mutation::decode(&[9]).is_err());
        let mut bytes = Mutation::RemoveVertices { ids: vec![1] }.encode();
        bytes.push(0);
        assert!(Mutation::decode(&bytes)
            .unwrap_err()
            .to_string()
            .contains("trailing"));
    }
}
