//! Matrix products of the training step (`C = alpha A B + beta C`, `C` row-major), on the
//! CPU's widest vector unit.
//!
//! The step's three products per chunk direction have one short side: the embedding dim `d`
//! (`b x n x d` scores, then `b x d x n` and `n x d x b` gradients, with `b` edges and `n`
//! negatives). On AVX-512 an own kernel computes them without packing `A`: each step of the
//! 12 x 32 register tile broadcasts 12 elements of `A` read where they are (a row-major `A`)
//! or from a 12-wide copy of the tile (a transposed `A`, whose rows are too far apart for the
//! L1 cache), against a `B` packed once per product into panels of 32 or 16 columns. Against
//! matrixmultiply, which packs both operands of every product, that saves re-reading and
//! re-writing the `b x n` loss weights, the largest array of the step (see docs/embed.md,
//! "Kernels"). Without AVX-512 the products go to matrixmultiply, which picks its own
//! AVX2/FMA or portable kernels at run time.

use std::cell::RefCell;
use std::sync::OnceLock;

use crate::compute::kernels;

/// Which implementation computes the products.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// The own AVX-512 kernel (x86-64 with AVX-512F, detected at run time).
    Avx512,
    /// matrixmultiply (any CPU).
    Portable,
}

impl Backend {
    /// The fastest backend this CPU runs (detected once).
    pub fn best() -> Backend {
        static BEST: OnceLock<Backend> = OnceLock::new();
        *BEST.get_or_init(|| {
            #[cfg(target_arch = "x86_64")]
            if std::is_x86_feature_detected!("avx512f") {
                return Backend::Avx512;
            }
            Backend::Portable
        })
    }
}

/// A read-only strided matrix: element `(i, j)` at `ptr + i * rs + j * cs`.
#[derive(Clone, Copy)]
pub struct Mat {
    ptr: *const f32,
    rs: isize,
    cs: isize,
}

impl Mat {
    /// `rows x cols` row-major in `v`.
    fn rows(v: &[f32], rows: usize, cols: usize) -> Mat {
        assert!(
            v.len() >= rows * cols,
            "matrix of {rows} x {cols} in {}",
            v.len()
        );
        Mat {
            ptr: v.as_ptr(),
            rs: cols as isize,
            cs: 1,
        }
    }

    /// The transpose of a `rows x cols` row-major matrix in `v` (so `cols x rows`).
    fn transposed(v: &[f32], rows: usize, cols: usize) -> Mat {
        let m = Mat::rows(v, rows, cols);
        Mat {
            rs: 1,
            cs: m.rs,
            ..m
        }
    }
}

/// The public products: each names how its row-major operands are laid out (in terms of the
/// dimensions `$m`, `$n`, `$k`, named by the caller for macro hygiene) and calls [`gemm_on`]
/// with the best backend.
macro_rules! products {
    (($m:ident, $n:ident, $k:ident) $($(#[$doc:meta])* $name:ident: $a:ident($ar:ident, $ac:ident), $b:ident($br:ident, $bc:ident);)*) => {$(
        $(#[$doc])*
        #[allow(clippy::too_many_arguments)] // the BLAS argument list
        pub fn $name(
            $m: usize,
            $n: usize,
            $k: usize,
            alpha: f32,
            a: &[f32],
            b: &[f32],
            beta: f32,
            c: &mut [f32],
        ) {
            let (a, b) = (Mat::$a(a, $ar, $ac), Mat::$b(b, $br, $bc));
            gemm_on(Backend::best(), $m, $n, $k, alpha, a, b, beta, c)
        }
    )*};
}

products! {
    (m, n, k)
    /// `C = alpha * A * B^T + beta * C` with `A: m x k`, `B: n x k`, `C: m x n`, all row-major.
    gemm_abt: rows(m, k), transposed(n, k);
    /// `C = alpha * A * B + beta * C` with `A: m x k`, `B: k x n`, `C: m x n`, all row-major.
    gemm_ab: rows(m, k), rows(k, n);
    /// `C = alpha * A^T * B + beta * C` with `A: k x m`, `B: k x n`, `C: m x n`, all row-major.
    gemm_atb: transposed(k, m), rows(k, n);
}

/// `C = alpha * A * B + beta * C` (`A: m x k`, `B: k x n`, `C: m x n` row-major) on `backend`.
#[allow(clippy::too_many_arguments)] // the BLAS argument list
fn gemm_on(
    backend: Backend,
    m: usize,
    n: usize,
    k: usize,
    alpha: f32,
    a: Mat,
    b: Mat,
    beta: f32,
    c: &mut [f32],
) {
    assert!(c.len() >= m * n, "C of {m} x {n} in {}", c.len());
    if m == 0 || n == 0 {
        return;
    }
    if m == 1 && a.cs == 1 && (b.rs == 1 || b.cs == 1) {
        // SAFETY: the views hold every element the strides reach (as below).
        return unsafe { row_product(n, k, alpha, a, b, beta, &mut c[..n]) };
    }
    match backend {
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512 => {
            assert!(Backend::best() == Backend::Avx512, "AVX-512 not available");
            PACKED.with(|p| {
                // SAFETY: AVX-512F was detected (asserted above); the views were built from
                // slices that hold every element they reach, and C holds m x n floats.
                unsafe { avx512::gemm(m, n, k, alpha, a, b, beta, c, &mut p.borrow_mut()) }
            })
        }
        // SAFETY: the views and C hold every element the strides reach (as above).
        _ => unsafe {
            matrixmultiply::sgemm(
                m,
                k,
                n,
                alpha,
                a.ptr,
                a.rs,
                a.cs,
                b.ptr,
                b.rs,
                b.cs,
                beta,
                c.as_mut_ptr(),
                n as isize,
                1,
            )
        },
    }
}

/// `c = alpha a B + beta c` for one contiguous row `a` of `k` floats and a `B` whose columns
/// (`rs == 1`: `n` dot products) or rows (`cs == 1`: `k` scaled row additions) are contiguous.
/// A packed product would fill one row of its 12-row tile and pack all of `B` for it: each
/// edge's step with negatives per edge is three products of one row.
///
/// # Safety
/// `a` holds `k` floats and `B` every element its strides reach for `k x n`.
unsafe fn row_product(n: usize, k: usize, alpha: f32, a: Mat, b: Mat, beta: f32, c: &mut [f32]) {
    let a = std::slice::from_raw_parts(a.ptr, k);
    // beta 0 overwrites C, whatever it held (NaN included), as BLAS does.
    let scaled = |x: f32, old: f32| if beta == 0.0 { x } else { x + beta * old };
    if b.rs == 1 {
        for (j, cj) in c.iter_mut().enumerate() {
            let col = std::slice::from_raw_parts(b.ptr.offset(j as isize * b.cs), k);
            *cj = scaled(alpha * kernels::dot(a, col), *cj);
        }
        return;
    }
    for cj in c.iter_mut() {
        *cj = scaled(0.0, *cj);
    }
    for (p, &ap) in a.iter().enumerate() {
        let row = std::slice::from_raw_parts(b.ptr.offset(p as isize * b.rs), n);
        let f = alpha * ap;
        for (cj, &x) in c.iter_mut().zip(row) {
            *cj += f * x;
        }
    }
}

thread_local! {
    /// The packed `B` of the thread's current product (reused: the step's are all alike).
    static PACKED: RefCell<Vec<f32>> = const { RefCell::new(Vec::new()) };
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use std::arch::x86_64::*;
    use std::ops::Range;

    use super::Mat;

    /// Rows of the register tile (broadcasts of `A`).
    const MR: usize = 12;
    /// Depth of one pass over `C`: a 32-column panel of `B` this deep fills 32 KiB of L1.
    const KC: usize = 256;

    /// Columns of `B` one pass over `C`'s rows keeps in L2: a `KC x NC` block is 512 KiB, so
    /// that every row tile of `A` reuses it (a product with 40,943 columns, 1vsAll's on
    /// WN18RR, otherwise streams all of packed `B` from memory once per 12 rows of `C`).
    const NC: usize = 512;

    /// The panels of columns `cols` of `n` (`cols.start` a multiple of 32): `(first column,
    /// width 32 or 16)`, 16 only for the last 1-16 columns of `n` (so that a dim of 100
    /// computes 112 columns, not 128).
    fn panels(n: usize, cols: Range<usize>) -> impl Iterator<Item = (usize, usize)> {
        let (mut j, end) = (cols.start, cols.end.min(n));
        std::iter::from_fn(move || {
            (j < end).then(|| {
                let w = if n - j > 16 { 32 } else { 16 };
                j += w;
                (j - w, w)
            })
        })
    }

    /// Packs `B` (`k x n`) panel by panel, each `k x width` row-major and zero-padded.
    unsafe fn pack_b(k: usize, n: usize, b: Mat, out: &mut Vec<f32>) {
        // Every element is written below: no need to clear what the last product left.
        out.resize(n.div_ceil(16) * 16 * k, 0.0);
        let mut at = 0;
        for (j0, w) in panels(n, 0..n) {
            let cols = w.min(n - j0);
            let dst = &mut out[at..at + k * w];
            for kk in 0..k {
                let row = b.ptr.offset(kk as isize * b.rs + j0 as isize * b.cs);
                dst[kk * w + cols..(kk + 1) * w].fill(0.0);
                let out = &mut dst[kk * w..kk * w + cols];
                if b.cs == 1 {
                    out.copy_from_slice(std::slice::from_raw_parts(row, cols));
                } else {
                    for (j, d) in out.iter_mut().enumerate() {
                        *d = *row.offset(j as isize * b.cs);
                    }
                }
            }
            at += k * w;
        }
    }

    /// `C[..rows, ..cols] = alpha * A[..rows, ..kc] * Bp + beta * C` for one `MR x 16 NV`
    /// tile: `a` is the tile's first row (`rows` of them valid), `bp` its packed panel
    /// (`kc x 16 NV`), `c` its top-left element of a matrix with `ldc` columns.
    #[target_feature(enable = "avx512f")]
    #[inline]
    #[allow(clippy::too_many_arguments)]
    unsafe fn tile<const NV: usize>(
        kc: usize,
        a: Mat,
        rows: usize,
        bp: *const f32,
        c: *mut f32,
        ldc: usize,
        cols: usize,
        alpha: f32,
        beta: f32,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NV]; MR];
        // Rows past the matrix repeat its last row; they are computed but never stored.
        let mut off = [0isize; MR];
        for (r, o) in off.iter_mut().enumerate() {
            *o = r.min(rows - 1) as isize * a.rs;
        }
        let (mut ap, mut b) = (a.ptr, bp);
        for _ in 0..kc {
            let mut bv = [_mm512_setzero_ps(); NV];
            for (v, x) in bv.iter_mut().enumerate() {
                *x = _mm512_loadu_ps(b.add(16 * v));
            }
            for r in 0..MR {
                let x = _mm512_set1_ps(*ap.offset(off[r]));
                for v in 0..NV {
                    acc[r][v] = _mm512_fmadd_ps(x, bv[v], acc[r][v]);
                }
            }
            ap = ap.offset(a.cs);
            b = b.add(16 * NV);
        }
        let (va, vb) = (_mm512_set1_ps(alpha), _mm512_set1_ps(beta));
        for v in 0..NV {
            let left = cols.saturating_sub(16 * v).min(16);
            let mask = ((1u32 << left) - 1) as __mmask16;
            for (r, acc) in acc.iter().enumerate().take(rows) {
                let p = c.add(r * ldc + 16 * v);
                let mut x = _mm512_mul_ps(acc[v], va);
                if beta != 0.0 {
                    x = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(mask, p), vb, x);
                }
                _mm512_mask_storeu_ps(p, mask, x);
            }
        }
    }

    /// `C = alpha * A * B + beta * C` with `C` row-major `m x n`; `packed` is scratch.
    #[target_feature(enable = "avx512f")]
    #[allow(clippy::too_many_arguments)]
    pub(super) unsafe fn gemm(
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: Mat,
        b: Mat,
        beta: f32,
        c: &mut [f32],
        packed: &mut Vec<f32>,
    ) {
        if k == 0 {
            for x in &mut c[..m * n] {
                *x = if beta == 0.0 { 0.0 } else { *x * beta };
            }
            return;
        }
        pack_b(k, n, b, packed);
        let c = c.as_mut_ptr();
        // A transposed tile's copy, k-major; 16 floats of slack for the last full-width store.
        let mut copy = [0.0f32; KC * MR + 16];
        let mut pc = 0;
        while pc < k {
            let kc = KC.min(k - pc);
            let beta = if pc == 0 { beta } else { 1.0 };
            for jc in (0..n).step_by(NC) {
                for i in (0..m).step_by(MR) {
                    let rows = MR.min(m - i);
                    let mut at = Mat {
                        ptr: a.ptr.offset(i as isize * a.rs + pc as isize * a.cs),
                        ..a
                    };
                    if a.rs == 1 {
                        // The tile's rows are adjacent floats and its steps `cs` apart: 4 KiB
                        // strides map every step to one L1 set, so read it once into a copy.
                        let mask = ((1u32 << rows) - 1) as __mmask16;
                        for kk in 0..kc {
                            let v = _mm512_maskz_loadu_ps(mask, at.ptr.offset(kk as isize * a.cs));
                            _mm512_storeu_ps(copy.as_mut_ptr().add(kk * MR), v);
                        }
                        at = Mat {
                            ptr: copy.as_ptr(),
                            rs: 1,
                            cs: MR as isize,
                        };
                    }
                    for (j0, w) in panels(n, jc..jc + NC) {
                        // Every panel before column j0 is 32 wide: this one starts k * j0 in.
                        let bp = packed.as_ptr().add(k * j0 + pc * w);
                        let cij = c.add(i * n + j0);
                        if w == 32 {
                            tile::<2>(kc, at, rows, bp, cij, n, n - j0, alpha, beta);
                        } else {
                            tile::<1>(kc, at, rows, bp, cij, n, n - j0, alpha, beta);
                        }
                    }
                }
            }
            pc += kc;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `C = alpha A B + beta C` by the definition, in f64.
    #[allow(clippy::too_many_arguments)]
    fn reference(
        m: usize,
        n: usize,
        k: usize,
        alpha: f32,
        a: impl Fn(usize, usize) -> f32,
        b: impl Fn(usize, usize) -> f32,
        beta: f32,
        c: &[f32],
    ) -> Vec<f32> {
        let mut out = vec![0.0f32; m * n];
        for i in 0..m {
            for j in 0..n {
                let s: f64 = (0..k).map(|p| a(i, p) as f64 * b(p, j) as f64).sum();
                out[i * n + j] = (alpha as f64 * s + beta as f64 * c[i * n + j] as f64) as f32;
            }
        }
        out
    }

    fn values(len: usize, seed: u64) -> Vec<f32> {
        let mut rng = strata_store::rng::Rng::new(seed);
        (0..len).map(|_| rng.next_f64() as f32 - 0.5).collect()
    }

    fn backends() -> Vec<Backend> {
        let mut out = vec![Backend::Portable];
        if Backend::best() == Backend::Avx512 {
            out.push(Backend::Avx512);
        }
        out
    }

    #[test]
    fn every_layout_and_edge_matches_the_definition() {
        // Shapes around the tile (12 x 32, panels of 16), depth block (256) and column block
        // (512) edges.
        let shapes = [
            (1, 1, 1),
            (13, 1100, 300),
            (12, 32, 256),
            (13, 33, 257),
            (25, 100, 7),
            (11, 17, 600),
            (40, 16, 3),
            (3, 5, 0),
            // One row (each edge's products with negatives per edge), with every layout.
            (1, 158, 512),
            (1, 512, 158),
            (1, 33, 1),
            (1, 1, 40),
            (1, 9, 0),
        ];
        for backend in backends() {
            for &(m, n, k) in &shapes {
                for (alpha, beta) in [(1.0, 0.0), (-2.0, 0.5)] {
                    let c0 = values(m * n, 3);
                    let a = values(m * k, 1);
                    let b = values(k * n, 2);
                    // A B, A Bᵀ and Aᵀ B with the same logical operands.
                    let bt: Vec<f32> = (0..n * k).map(|x| b[(x % k) * n + x / k]).collect();
                    let at: Vec<f32> = (0..k * m).map(|x| a[(x % m) * k + x / m]).collect();
                    let want = reference(
                        m,
                        n,
                        k,
                        alpha,
                        |i, p| a[i * k + p],
                        |p, j| b[p * n + j],
                        beta,
                        &c0,
                    );
                    let cases = [
                        (Mat::rows(&a, m, k), Mat::rows(&b, k, n)),
                        (Mat::rows(&a, m, k), Mat::transposed(&bt, n, k)),
                        (Mat::transposed(&at, k, m), Mat::rows(&b, k, n)),
                    ];
                    for (layout, (am, bm)) in cases.into_iter().enumerate() {
                        let mut c = c0.clone();
                        gemm_on(backend, m, n, k, alpha, am, bm, beta, &mut c);
                        let worst = c
                            .iter()
                            .zip(&want)
                            .map(|(x, y)| (x - y).abs())
                            .fold(0.0f32, f32::max);
                        assert!(
                            worst < 1e-4 * (k as f32).sqrt().max(1.0),
                            "{backend:?} layout {layout} {m}x{n}x{k}: off by {worst}"
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn public_products_use_their_layouts() {
        // A = [[1,2],[3,4]], B = [[5,6],[7,8]]
        let a = [1.0, 2.0, 3.0, 4.0];
        let b = [5.0, 6.0, 7.0, 8.0];
        let mut c = [0.0f32; 4];
        gemm_abt(2, 2, 2, 1.0, &a, &b, 0.0, &mut c);
        assert_eq!(c, [17.0, 23.0, 39.0, 53.0]);
        gemm_ab(2, 2, 2, 1.0, &a, &b, 0.0, &mut c);
        assert_eq!(c, [19.0, 22.0, 43.0, 50.0]);
        gemm_atb(2, 2, 2, 1.0, &a, &b, 0.0, &mut c);
        assert_eq!(c, [26.0, 30.0, 38.0, 44.0]);
    }
}
