//! The edge kernel of the frontier algorithms (BFS, SSSP, WCC, radii, HyperANF, SCC's
//! coloring): one pass carries each frontier vertex's value along its out-edges, and every
//! destination whose value changes joins the next frontier. What "carry" means is each
//! algorithm's [`Step`]; the loop over a block's edges, the frontier test and the count are
//! [`Frontier`]'s, the same for all of them.

use crate::stream::EdgeKernel;
use crate::vertex::Bitmap;

/// What a frontier algorithm does along one edge `u -> v` whose source is in the frontier.
pub(super) trait Step: Sync {
    /// Whether the step reads edge weights (`w` is 0 otherwise).
    const WEIGHTED: bool = false;

    /// Carries `u`'s value along the edge (weight `w`) to `v`; whether `v`'s value changed.
    /// `owns_dst`: no other thread writes `v` meanwhile (plain stores do), else the update is
    /// atomic.
    fn carry(&self, u: usize, v: usize, w: f32, owns_dst: bool) -> bool;

    /// `v` changed: it joins `next`; whether it counts as activated. By default every change
    /// counts (a vertex lowered twice in a pass, twice).
    #[inline]
    fn activate(&self, next: &Bitmap, v: usize) -> bool {
        next.set(v);
        true
    }
}

/// The frontier kernel: for each edge of a block whose source is in `frontier`, the step's
/// [`Step::carry`] and, when the destination changed, its [`Step::activate`] into `next`.
/// A block's count is the activations.
pub(super) struct Frontier<'a, S> {
    pub frontier: &'a Bitmap,
    pub next: &'a Bitmap,
    /// Global id of each chunk's first vertex.
    pub base: &'a [u64],
    pub step: S,
}

impl<S: Step> EdgeKernel for Frontier<'_, S> {
    fn weighted(&self) -> bool {
        S::WEIGHTED
    }

    fn block(&self, i: u32, j: u32, edges: &[[u32; 2]], weights: &[f32], owns_dst: bool) -> u64 {
        // The references copied into locals: the loop's atomic stores cannot change a local,
        // so the compiler keeps them in registers instead of reloading them through `self`
        // for every edge (BFS's pass was 8% slower that way).
        let (frontier, next, step) = (self.frontier, self.next, &self.step);
        let (sb, db) = (
            self.base[i as usize] as usize,
            self.base[j as usize] as usize,
        );
        let mut activated = 0;
        let mut visit = |s: u32, d: u32, w: f32| {
            let u = sb + s as usize;
            // Most edges leave vertices outside the frontier: the test comes first, alone.
            if !frontier.get(u) {
                return;
            }
            let v = db + d as usize;
            if step.carry(u, v, w, owns_dst) && step.activate(next, v) {
                activated += 1;
            }
        };
        if S::WEIGHTED {
            for (&[s, d], &w) in edges.iter().zip(weights) {
                visit(s, d, w);
            }
        } else {
            for &[s, d] in edges {
                visit(s, d, 0.0);
            }
        }
        activated
    }
}

/// Min-label propagation: `v` takes `u`'s label when it is smaller (WCC, SCC's coloring).
pub(super) struct MinLabel<'a> {
    pub label: &'a crate::vertex::U64Array,
}

impl Step for MinLabel<'_> {
    #[inline]
    fn carry(&self, u: usize, v: usize, _: f32, owns_dst: bool) -> bool {
        let l = self.label.get(u);
        if l >= self.label.get(v) {
            return false;
        }
        if owns_dst {
            self.label.set(v, l);
            true
        } else {
            self.label.min_shared(v, l)
        }
    }
}
