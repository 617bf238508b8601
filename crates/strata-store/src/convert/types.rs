//! Node and edge types of a typed conversion (format 2), read from two small TSV files, and
//! the edge-type lookup the parser runs on every edge.
//!
//! `--node-types FILE`: one line per node type in id order, either `NAME<TAB>COUNT` (edges hold
//! integer global ids: the first type owns ids `0 .. COUNT`, the next the following `COUNT`
//! ids, and so on) or `NAME` alone (edges hold node names, and each type's count is the number
//! of distinct names of that type the inputs hold; see [`name_key`]).
//! `--edge-types FILE`: one line per edge type, `SRC_TYPE<TAB>RELATION<TAB>DST_TYPE`, naming
//! node types of the first file; a line's position is the edge type's id. With per-edge-type
//! edge files (`--edges-of`) it may be left out: the files' edge types are declared in the
//! order they are given.
//! Lines that are blank or start with `#` are skipped. Names may hold any characters but tab
//! and newline.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use crate::error::{quoted, Result, StoreError};
use crate::manifest::{EdgeType, NodeType};

/// The types of a conversion; empty (untyped) by default.
#[derive(Debug, Clone, Default)]
pub(crate) struct Types {
    pub node_types: Vec<NodeType>,
    pub edge_types: Vec<EdgeType>,
    /// Edge-type ids by relation name.
    by_relation: HashMap<Vec<u8>, Vec<u32>>,
    /// The node types file gave counts (integer ids); without them the edges hold names and
    /// the counts come from the names.
    pub counted: bool,
    /// The node types file, for messages.
    node_file: PathBuf,
}

/// Bytes [`name_key`] puts before a name.
pub(crate) const KEY_PREFIX: u64 = 4;

/// The dictionary key of node `name` of node type `node_type` in a typed conversion with
/// names: the type as 4 big-endian bytes, then the name. Sorting keys byte-wise sorts names by
/// (type, name), so each type's names fill its contiguous id range in sorted order and a name's
/// global id is its key's rank.
pub(crate) fn name_key(node_type: u32, name: &[u8], key: &mut Vec<u8>) {
    key.clear();
    key.extend_from_slice(&node_type.to_be_bytes());
    key.extend_from_slice(name);
}

/// The node type and the name of a key made by [`name_key`].
pub(crate) fn split_key(key: &[u8]) -> (u32, &[u8]) {
    let (t, name) = key.split_at(KEY_PREFIX as usize);
    (u32::from_be_bytes(t.try_into().unwrap()), name)
}

/// The data lines of a types file: (line number, tab-separated fields), each line with
/// `min ..= max` fields.
fn lines(path: &Path, min: usize, max: usize) -> Result<Vec<(u64, Vec<String>)>> {
    // A regular file only: a device such as /dev/zero would be read for ever.
    super::file_len(path)?;
    let bytes = std::fs::read(path).map_err(|e| StoreError::os("read", path, e))?;
    let text = String::from_utf8(bytes)
        .map_err(|e| StoreError::bad_file(path, format!("is not UTF-8 text: {e}")))?;
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        let line_no = i as u64 + 1;
        if line.trim().is_empty() || line.trim_start().starts_with('#') {
            continue;
        }
        let parts: Vec<String> = line.split('\t').map(str::to_string).collect();
        if !(min..=max).contains(&parts.len()) || parts.iter().any(String::is_empty) {
            let fields = if min == max {
                min.to_string()
            } else {
                format!("{min} to {max}")
            };
            return Err(StoreError::input(
                path,
                line_no,
                format!(
                    "expected {fields} non-empty tab-separated fields, found [{}]",
                    parts
                        .iter()
                        .map(|p| quoted(p.as_bytes()))
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            ));
        }
        out.push((line_no, parts));
    }
    if out.is_empty() {
        return Err(StoreError::bad_file(path, "declares no types"));
    }
    Ok(out)
}

impl Types {
    /// Reads the node-types file and, when given, the edge-types file (see the module doc).
    pub fn read(node_file: &Path, edge_file: Option<&Path>) -> Result<Types> {
        let mut node_types: Vec<NodeType> = Vec::new();
        let mut offset = 0u64;
        let node_lines = lines(node_file, 1, 2)?;
        let counted = node_lines[0].1.len() == 2;
        for (line, f) in node_lines {
            if node_types.iter().any(|t| t.name == f[0]) {
                return Err(StoreError::input(
                    node_file,
                    line,
                    format!("node type '{}' is declared twice", f[0]),
                ));
            }
            if (f.len() == 2) != counted {
                return Err(StoreError::input(
                    node_file,
                    line,
                    format!(
                        "node type '{}' {} a count but the first type {}: give every type a COUNT (edges with integer global ids) or none (edges with node names)",
                        f[0],
                        if counted { "lacks" } else { "has" },
                        if counted { "has one" } else { "does not" }
                    ),
                ));
            }
            let Some(count_field) = f.get(1) else {
                node_types.push(NodeType {
                    name: f[0].clone(),
                    offset: 0,
                    count: 0,
                    features: None,
                    labels: None,
                    node_splits: Default::default(),
                    bags: None,
                });
                continue;
            };
            let count: u64 = count_field.trim().parse().map_err(|_| {
                StoreError::input(
                    node_file,
                    line,
                    format!(
                        "count {} of node type '{}' is not a non-negative integer",
                        quoted(count_field.as_bytes()),
                        f[0]
                    ),
                )
            })?;
            node_types.push(NodeType {
                name: f[0].clone(),
                offset,
                count,
                features: None,
                labels: None,
                node_splits: Default::default(),
                bags: None,
            });
            offset = offset.checked_add(count).ok_or_else(|| {
                StoreError::input(node_file, line, "node counts overflow 64 bits")
            })?;
        }
        let mut types = Types {
            node_types,
            edge_types: Vec::new(),
            by_relation: HashMap::new(),
            counted,
            node_file: node_file.to_path_buf(),
        };
        let Some(edge_file) = edge_file else {
            return Ok(types);
        };
        for (line, f) in lines(edge_file, 3, 3)? {
            let et = types
                .edge_type(&f[0], &f[1], &f[2])
                .map_err(|msg| StoreError::input(edge_file, line, msg))?;
            if types.edge_types.contains(&et) {
                return Err(StoreError::input(
                    edge_file,
                    line,
                    format!("edge type ({}, {}, {}) is declared twice", f[0], f[1], f[2]),
                ));
            }
            types.declare(et);
        }
        Ok(types)
    }

    /// The edge type (`src`, `relation`, `dst`) by node type names, or why a name is not a
    /// node type.
    fn edge_type(
        &self,
        src: &str,
        relation: &str,
        dst: &str,
    ) -> std::result::Result<EdgeType, String> {
        let index = |name: &str, field: &str| {
            self.node_types
                .iter()
                .position(|t| t.name == name)
                .map(|i| i as u64)
                .ok_or_else(|| {
                    format!(
                        "{field} '{name}' is not a node type of {} (it declares: {})",
                        self.node_file.display(),
                        self.node_types
                            .iter()
                            .map(|t| t.name.as_str())
                            .collect::<Vec<_>>()
                            .join(", ")
                    )
                })
        };
        Ok(EdgeType {
            src_type: index(src, "source type")?,
            relation: relation.to_string(),
            dst_type: index(dst, "destination type")?,
        })
    }

    /// Adds edge type `et` (not yet declared) with the next id.
    fn declare(&mut self, et: EdgeType) -> u32 {
        let id = self.edge_types.len() as u32;
        self.by_relation
            .entry(et.relation.as_bytes().to_vec())
            .or_default()
            .push(id);
        self.edge_types.push(et);
        id
    }

    /// The id of the edge type of a per-edge-type edge file, `[src, relation, dst]` by names:
    /// one of the declared types, or, when `declare`, a new one if it is not declared yet (the
    /// edge types then come from the files in the order given).
    pub fn file_edge_type(
        &mut self,
        names: &[String; 3],
        declare: bool,
    ) -> std::result::Result<u32, String> {
        let et = self.edge_type(&names[0], &names[1], &names[2])?;
        if let Some(i) = self.edge_types.iter().position(|e| *e == et) {
            return Ok(i as u32);
        }
        if !declare {
            return Err(format!(
                "edge type ({}, {}, {}) is not declared in the edge types file",
                names[0], names[1], names[2]
            ));
        }
        Ok(self.declare(et))
    }

    /// The types with each node type's count (and so its id range) set from `counts`, one per
    /// node type in id order: the distinct names of each type found in the inputs.
    pub fn with_counts(&self, counts: &[u64]) -> Types {
        let mut t = self.clone();
        let mut offset = 0;
        for (nt, &count) in t.node_types.iter_mut().zip(counts) {
            (nt.offset, nt.count) = (offset, count);
            offset += count;
        }
        t.counted = true;
        t
    }

    /// Refuses edge types whose endpoints' node types cannot be told from an edge's relation
    /// field alone (`has_rel`) or, without one, from the only edge type: with names the
    /// endpoint types must be known before the names are looked up.
    pub fn check_named_endpoints(&self, has_rel: bool, edge_file: &Path) -> Result<()> {
        if !has_rel {
            if let [_, second, ..] = &self.edge_types[..] {
                return Err(StoreError::option(
                    "columns",
                    format!(
                        "{} declares several edge types (the second is {}): edges with node names need a rel column naming each edge's relation",
                        edge_file.display(),
                        self.describe_edge_type(second)
                    ),
                ));
            }
            return Ok(());
        }
        for (i, a) in self.edge_types.iter().enumerate() {
            if let Some(b) = self.edge_types[..i]
                .iter()
                .find(|b| b.relation == a.relation)
            {
                return Err(StoreError::bad_file(
                    edge_file,
                    format!(
                        "relation '{}' names two edge types, {} and {}: edges with node names tell their endpoints' types from the relation alone, so give each edge type its own relation name",
                        a.relation,
                        self.describe_edge_type(b),
                        self.describe_edge_type(a)
                    ),
                ));
            }
        }
        Ok(())
    }

    /// The edge type of an edge whose endpoints are names, from its relation field `rel`
    /// (`None` without a relation column, when there is one edge type; see
    /// [`Types::check_named_endpoints`]), or why there is none.
    pub fn named_edge_type(&self, rel: Option<&[u8]>) -> std::result::Result<u32, String> {
        let Some(rel) = rel else {
            return Ok(0);
        };
        match self.by_relation.get(rel) {
            Some(ids) => Ok(ids[0]),
            None => Err(self.unknown_relation(rel)),
        }
    }

    /// (source type, destination type) of edge type `etype`.
    pub fn endpoints(&self, etype: u32) -> (u32, u32) {
        let e = &self.edge_types[etype as usize];
        (e.src_type as u32, e.dst_type as u32)
    }

    pub fn is_typed(&self) -> bool {
        !self.node_types.is_empty()
    }

    /// Total nodes of every type.
    pub fn num_nodes(&self) -> u64 {
        self.node_types.last().map_or(0, |t| t.offset + t.count)
    }

    /// Refuses an input without a relation column when two edge types join the same pair of
    /// node types (the edge type could not be told from the endpoints).
    pub fn check_without_relation(&self) -> Result<()> {
        for (i, a) in self.edge_types.iter().enumerate() {
            if let Some(b) = self.edge_types[..i]
                .iter()
                .find(|b| (b.src_type, b.dst_type) == (a.src_type, a.dst_type))
            {
                return Err(StoreError::option(
                    "columns",
                    format!(
                        "edge types '{}' and '{}' both join {} to {}: the input needs a rel column to tell them apart",
                        b.relation,
                        a.relation,
                        self.node_types[a.src_type as usize].name,
                        self.node_types[a.dst_type as usize].name
                    ),
                ));
            }
        }
        Ok(())
    }

    /// Index of the node type owning global id `node` (< `num_nodes`).
    pub fn type_of(&self, node: u64) -> usize {
        self.node_types.partition_point(|t| t.offset <= node) - 1
    }

    fn describe_node(&self, role: &str, node: u64) -> String {
        let t = &self.node_types[self.type_of(node)];
        format!(
            "{role} {node} is a '{}' node (ids {}..{})",
            t.name,
            t.offset,
            t.offset + t.count
        )
    }

    fn unknown_relation(&self, rel: &[u8]) -> String {
        let mut known: Vec<&str> = self
            .edge_types
            .iter()
            .map(|e| e.relation.as_str())
            .collect();
        known.dedup();
        format!(
            "unknown relation {} (the edge types declare: {})",
            quoted(rel),
            known.join(", ")
        )
    }

    fn describe_edge_type(&self, e: &EdgeType) -> String {
        format!(
            "({}, {}, {})",
            self.node_types[e.src_type as usize].name,
            e.relation,
            self.node_types[e.dst_type as usize].name
        )
    }

    /// The edge type of an edge from `src` to `dst` (global ids below [`Types::num_nodes`])
    /// with relation field `rel` (`None` without a relation column), or why there is none.
    pub fn resolve(
        &self,
        src: u64,
        rel: Option<&[u8]>,
        dst: u64,
    ) -> std::result::Result<u32, String> {
        let (ts, td) = (self.type_of(src) as u64, self.type_of(dst) as u64);
        let fits = |i: u32| {
            let e = &self.edge_types[i as usize];
            e.src_type == ts && e.dst_type == td
        };
        let Some(rel) = rel else {
            let found = (0..self.edge_types.len() as u32).find(|&i| fits(i));
            return found.ok_or_else(|| {
                format!(
                    "no edge type joins {} to {}: {} and {}",
                    self.node_types[ts as usize].name,
                    self.node_types[td as usize].name,
                    self.describe_node("src", src),
                    self.describe_node("dst", dst)
                )
            });
        };
        let Some(candidates) = self.by_relation.get(rel) else {
            return Err(self.unknown_relation(rel));
        };
        if let Some(&i) = candidates.iter().find(|&&i| fits(i)) {
            return Ok(i);
        }
        // Name the endpoint that is outside the declared type(s).
        let e = &self.edge_types[candidates[0] as usize];
        let wrong = if candidates
            .iter()
            .all(|&i| self.edge_types[i as usize].src_type != ts)
        {
            self.describe_node("src", src)
        } else {
            self.describe_node("dst", dst)
        };
        let declared: Vec<String> = candidates
            .iter()
            .map(|&i| self.describe_edge_type(&self.edge_types[i as usize]))
            .collect();
        Err(format!(
            "relation '{}' is declared as {}, but {wrong}",
            e.relation,
            declared.join(" or ")
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn types(nodes: &str, edges: &str) -> Result<Types> {
        let dir = tempfile::tempdir().unwrap();
        let (n, e) = (dir.path().join("nodes.tsv"), dir.path().join("edges.tsv"));
        std::fs::write(&n, nodes).unwrap();
        std::fs::write(&e, edges).unwrap();
        Types::read(&n, Some(&e))
    }

    #[test]
    fn types_cover_ids_in_order_and_resolve_edges() {
        let t = types(
            "# type\tcount\npaper\t3\nauthor\t2\n",
            "paper\tcites\tpaper\nauthor\twrites\tpaper\npaper\trev writes\tauthor\n",
        )
        .unwrap();
        assert_eq!(t.num_nodes(), 5);
        assert_eq!((t.node_types[1].offset, t.node_types[1].count), (3, 2));
        assert_eq!(t.resolve(0, Some(b"cites"), 2), Ok(0));
        assert_eq!(t.resolve(4, Some(b"writes"), 1), Ok(1));
        assert_eq!(t.resolve(1, Some(b"rev writes"), 3), Ok(2));
        assert_eq!(t.resolve(4, None, 0), Ok(1));
        let err = t.resolve(3, Some(b"cites"), 0).unwrap_err();
        assert!(
            err.contains(
                "declared as (paper, cites, paper), but src 3 is a 'author' node (ids 3..5)"
            ),
            "{err}"
        );
        let err = t.resolve(4, Some(b"writes"), 4).unwrap_err();
        assert!(err.contains("dst 4 is a 'author'"), "{err}");
        assert!(t
            .resolve(0, Some(b"likes"), 1)
            .unwrap_err()
            .starts_with("unknown relation 'likes'"));
        assert!(t
            .resolve(3, None, 4)
            .unwrap_err()
            .starts_with("no edge type joins author to author"));
        t.check_without_relation().unwrap();
    }

    #[test]
    fn named_types_take_counts_from_the_names_and_keys_sort_by_type_first() {
        let t = types(
            "paper\nauthor\n",
            "paper\tcites\tpaper\nauthor\twrites\tpaper\n",
        )
        .unwrap();
        assert!(!t.counted);
        t.check_named_endpoints(true, Path::new("e.tsv")).unwrap();
        assert_eq!(t.named_edge_type(Some(b"writes")), Ok(1));
        assert_eq!(t.endpoints(1), (1, 0));
        assert!(t
            .named_edge_type(Some(b"likes"))
            .unwrap_err()
            .starts_with("unknown relation 'likes'"));
        let t = t.with_counts(&[3, 2]);
        assert!(t.counted);
        assert_eq!((t.node_types[1].offset, t.node_types[1].count), (3, 2));
        assert_eq!(t.type_of(3), 1);
        // Type 0's "zz" sorts before type 1's "a": the type comes first.
        let (mut a, mut b) = (Vec::new(), Vec::new());
        name_key(0, b"zz", &mut a);
        name_key(1, b"a", &mut b);
        assert!(a < b);
        assert_eq!(split_key(&b), (1, &b"a"[..]));
    }

    #[test]
    fn named_endpoints_need_a_relation_that_names_one_edge_type() {
        let t = types(
            "paper\nauthor\n",
            "paper\tcites\tpaper\nauthor\tcites\tpaper\n",
        )
        .unwrap();
        let err = t
            .check_named_endpoints(true, Path::new("e.tsv"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("e.tsv: relation 'cites' names two edge types, (paper, cites, paper) and (author, cites, paper)"),
            "{err}"
        );
        let err = t
            .check_named_endpoints(false, Path::new("e.tsv"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("need a rel column"), "{err}");
        let one = types("paper\n", "paper\tcites\tpaper\n").unwrap();
        one.check_named_endpoints(false, Path::new("e.tsv"))
            .unwrap();
        assert_eq!(one.named_edge_type(None), Ok(0));
        let err = types("paper\t3\nauthor\n", "paper\tcites\tpaper\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains(
                "nodes.tsv:2: node type 'author' lacks a count but the first type has one"
            ),
            "{err}"
        );
    }

    #[test]
    fn bad_type_files_name_file_and_line() {
        let err = types("paper\tx\n", "paper\tcites\tpaper\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("nodes.tsv:1: count 'x' of node type 'paper'"),
            "{err}"
        );
        let err = types("paper\t2\n", "paper\tcites\tvenue\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("edges.tsv:1: destination type 'venue' is not a node type"),
            "{err}"
        );
        let err = types("paper\t2\n", "\npaper cites paper\n")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("edges.tsv:2: expected 3 non-empty tab-separated fields"),
            "{err}"
        );
        let t = types("paper\t2\n", "paper\tcites\tpaper\npaper\trefs\tpaper\n").unwrap();
        let err = t.check_without_relation().unwrap_err().to_string();
        assert!(
            err.contains("'cites' and 'refs' both join paper to paper"),
            "{err}"
        );
    }
}
