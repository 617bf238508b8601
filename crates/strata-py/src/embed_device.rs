//! The device step of embedding training: the torch backend of the Python package
//! (`strata.embed.device.backend.TorchCompute`) behind the compute seam. The epoch loop runs
//! without the GIL; each piece takes it, lends the resident slots to Python as writable
//! memoryviews with the address that keys them (`DeviceTable::key`) and releases the views
//! before the slots move again. The slot hooks reach the backend the same way: it copies a
//! slot to its device when the I/O engine has filled it, and back before it is written.

use std::ffi::c_char;

use pyo3::exceptions::PyImportError;
use pyo3::ffi;
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use strata_embed::{
    DeviceCounters, DeviceLanding, DevicePiece, DeviceStep, DeviceTable, DrawSpan, SlotKind,
    StepCounters,
};

/// The Python backend object of one job.
struct PyDeviceStep {
    backend: Py<PyAny>,
}

/// A memoryview of `len` values of `size` bytes at `ptr`, writable when `write`.
///
/// # Safety
/// The memory must stay valid (and, when `write`, not be read or written by Rust) until the
/// view is released.
pub(crate) unsafe fn view<'py>(
    py: Python<'py>,
    ptr: *mut u8,
    bytes: usize,
    write: bool,
) -> PyResult<Bound<'py, PyAny>> {
    let flags = if write {
        ffi::PyBUF_WRITE
    } else {
        ffi::PyBUF_READ
    };
    // SAFETY: the caller keeps the memory valid until `release`; an empty view may take any
    // non-null pointer.
    let obj = unsafe {
        ffi::PyMemoryView_FromMemory(ptr as *mut c_char, bytes as ffi::Py_ssize_t, flags)
    };
    // SAFETY: a new reference or null with the exception set.
    unsafe { Bound::from_owned_ptr_or_err(py, obj) }
}

/// `(view, address)` of `data`, memory the job keeps for all its steps, lent read-only (the
/// address keys the device's copy of it); the view is kept in `views` for release before the
/// call returns.
fn lent<'py, T>(
    py: Python<'py>,
    data: &[T],
    views: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<(Bound<'py, PyAny>, usize)> {
    // SAFETY: read-only, and `data` outlives the call, before whose end the view is released.
    let v = unsafe {
        view(
            py,
            data.as_ptr() as *mut u8,
            std::mem::size_of_val(data),
            false,
        )?
    };
    views.push(v.clone());
    Ok((v, data.as_ptr() as usize))
}

/// `(params, state, rows, key, dtype, span)` of a lent table (`dtype` "f32" or "bf16"; `span`
/// the bytes of its own host buffer, `DeviceTable::span`), its views kept in `views` for
/// release.
fn table<'py>(
    py: Python<'py>,
    t: &DeviceTable,
    views: &mut Vec<Bound<'py, PyAny>>,
) -> PyResult<Bound<'py, PyAny>> {
    let (params_bytes, state_bytes) = t.bytes();
    // SAFETY: the table is lent for the call; every view is released before it returns.
    let params = unsafe { view(py, t.params, params_bytes, true)? };
    let state = unsafe { view(py, t.state, state_bytes, true)? };
    views.push(params.clone());
    views.push(state.clone());
    Ok((params, state, t.rows, t.key(), t.dtype.name(), t.span)
        .into_pyobject(py)?
        .into_any())
}

/// Each side's draw spans as `(part, first row, entities, bank)` tuples: `bank` is `None`
/// for rows of a resident part, `(partition, first bank row, bank rows)` for a partition on
/// disk (`part` then `None`).
type Span = (Option<usize>, u32, u64, Option<(u32, u32, u32)>);

fn spans(sides: &[Vec<DrawSpan>; 2]) -> [Vec<Span>; 2] {
    sides.each_ref().map(|side| {
        side.iter()
            .map(|s| match *s {
                DrawSpan::Rows {
                    part,
                    first,
                    entities,
                } => (Some(part), first, entities, None),
                DrawSpan::Bank {
                    partition,
                    at,
                    len,
                    entities,
                } => (None, 0, entities, Some((partition, at, len))),
            })
            .collect()
    })
}

impl PyDeviceStep {
    fn call<'py>(
        &self,
        py: Python<'py>,
        piece: &DevicePiece,
        bank_grad: &mut [f32],
        views: &mut Vec<Bound<'py, PyAny>>,
    ) -> PyResult<StepCounters> {
        let ctxs = PyList::empty(py);
        for c in piece.ctxs {
            let d = PyDict::new(py);
            d.set_item("model", c.model)?;
            let (operator, comparator) = c.pbg.unzip();
            d.set_item("operator", operator)?;
            d.set_item("comparator", comparator)?;
            d.set_item("dim", c.dim)?;
            d.set_item("transe_norm", c.transe_norm)?;
            d.set_item("loss", c.loss)?;
            d.set_item("margin", c.margin)?;
            d.set_item("gamma", c.gamma)?;
            d.set_item("adversarial", c.adversarial)?;
            d.set_item("lr", c.lr)?;
            let parts = PyList::empty(py);
            for p in &c.parts {
                parts.append(table(py, p, views)?)?;
            }
            d.set_item("parts", parts)?;
            d.set_item("src_part", c.src_part)?;
            d.set_item("dst_part", c.dst_part)?;
            match &c.rels {
                Some(r) => d.set_item("rels", table(py, r, views)?)?,
                None => d.set_item("rels", py.None())?,
            }
            d.set_item("inverse_offset", c.inverse_offset)?;
            d.set_item("corrupt", c.corrupt)?;
            d.set_item("head_prob", c.head_prob.clone())?;
            d.set_item("negatives", c.negatives)?;
            d.set_item("negatives_head", c.negatives_head)?;
            d.set_item("shared_negatives", c.shared_negatives)?;
            d.set_item("degree_fraction", c.degree_fraction)?;
            d.set_item("pool", c.pool)?;
            d.set_item("part_of", c.part_of.clone())?;
            d.set_item("part_size", c.part_size)?;
            d.set_item("num_nodes", c.num_nodes)?;
            match &c.bank {
                Some(b) => {
                    let bank = PyDict::new(py);
                    // Read-only: the banks outlive the piece and change only between pieces.
                    bank.set_item("rows", lent(py, b.rows, views)?)?;
                    bank.set_item("version", b.version)?;
                    bank.set_item("capacity", b.capacity)?;
                    bank.set_item("lens", b.lens.clone())?;
                    d.set_item("bank", bank)?;
                }
                None => d.set_item("bank", py.None())?,
            }
            d.set_item("typed_spans", c.typed_spans.as_ref().map(spans))?;
            match &c.feat {
                Some(f) => {
                    let feat = PyDict::new(py);
                    feat.set_item("part", f.part)?;
                    feat.set_item("plain", f.plain)?;
                    // The bags outlive the job's steps.
                    feat.set_item("offsets", lent(py, f.offsets, views)?)?;
                    feat.set_item("rows", lent(py, f.rows, views)?)?;
                    d.set_item("feat", feat)?;
                }
                None => d.set_item("feat", py.None())?,
            }
            d.set_item("reg", c.reg)?;
            d.set_item("reg_weight", c.reg_weight)?;
            d.set_item("reg_weighted", c.reg_weighted)?;
            d.set_item("rel_reg_weight", c.rel_reg_weight)?;
            d.set_item("entity_dropout", c.entity_dropout)?;
            d.set_item("relation_dropout", c.relation_dropout)?;
            d.set_item("independent_masks", c.independent_masks)?;
            d.set_item("training", c.training)?;
            d.set_item("label_smoothing", c.label_smoothing)?;
            d.set_item("reg_table", c.reg_table)?;
            match c.answers {
                Some(sides) => {
                    // The answers outlive the job's steps.
                    let list = PyList::empty(py);
                    for rows in sides {
                        list.append(lent(py, rows, views)?)?;
                    }
                    d.set_item("answers", list)?;
                }
                None => d.set_item("answers", py.None())?,
            }
            ctxs.append(d)?;
        }
        // SAFETY: the piece's edges and weights outlive the call; the views are read-only and
        // released before it returns.
        let edges = unsafe {
            view(
                py,
                piece.edges.as_ptr() as *mut u8,
                piece.edges.len() * 12,
                false,
            )?
        };
        let weights = unsafe {
            view(
                py,
                piece.weights.as_ptr() as *mut u8,
                piece.weights.len() * 4,
                false,
            )?
        };
        // SAFETY: `bank_grad` is borrowed mutably for the call; the view is released before
        // it returns.
        let bank_grad = unsafe {
            view(
                py,
                bank_grad.as_mut_ptr() as *mut u8,
                std::mem::size_of_val(bank_grad),
                true,
            )?
        };
        views.push(edges.clone());
        views.push(weights.clone());
        views.push(bank_grad.clone());
        let (loss, directions, flops, busy): (f64, u64, f64, f64) = self
            .backend
            .call_method1(
                py,
                "train_piece",
                (
                    ctxs,
                    piece.groups.to_vec(),
                    piece.bounds.to_vec(),
                    edges,
                    weights,
                    piece.key,
                    bank_grad,
                ),
            )?
            .extract(py)?;
        Ok(StepCounters {
            loss,
            directions,
            flops,
            busy,
        })
    }
}

/// Runs `f` with the GIL and a list of views to release after it: the exception (and its
/// traceback's frames, which may hold tensors over the views) is turned into its message
/// before the views are released.
fn with_views<T>(
    what: &str,
    f: impl for<'py> FnOnce(Python<'py>, &mut Vec<Bound<'py, PyAny>>) -> PyResult<T>,
) -> Result<T, String> {
    Python::attach(|py| {
        let mut views = Vec::new();
        let outcome = f(py, &mut views).map_err(|e| format!("{what}: {e}"));
        for v in views {
            if let Err(e) = v.call_method0("release") {
                // A view still exported (a tensor kept past the call) would outlive the
                // slot it points into: fail the job rather than let it.
                return Err(format!("{what} kept a view of a partition slot: {e}"));
            }
        }
        outcome
    })
}

impl DeviceStep for PyDeviceStep {
    fn train_piece(
        &mut self,
        piece: &DevicePiece,
        bank_grad: &mut [f32],
    ) -> Result<StepCounters, String> {
        with_views("device step", |py, views| {
            self.call(py, piece, bank_grad, views)
        })
    }

    fn slot_in(&mut self, kind: SlotKind, t: &DeviceTable) -> Result<(), String> {
        let kind = match kind {
            SlotKind::Partition => "partition",
            SlotKind::Pinned => "pinned",
            SlotKind::Relations => "relations",
        };
        with_views("device slot copy in", |py, views| {
            let t = table(py, t, views)?;
            self.backend.call_method1(py, "slot_in", (kind, t))?;
            Ok(())
        })
    }

    fn slot_out(&mut self, t: &DeviceTable, evict: bool) -> Result<(), String> {
        with_views("device slot write-back", |py, views| {
            let t = table(py, t, views)?;
            self.backend.call_method1(py, "slot_out", (t, evict))?;
            Ok(())
        })
    }

    fn slot_evict_async(&mut self, t: &DeviceTable) -> Result<DeviceLanding, String> {
        let land = with_views("device slot write-back", |py, views| {
            let t = table(py, t, views)?;
            self.backend.call_method1(py, "slot_out", (t, true, true))
        })?;
        let slot = LeavingSlot(*t);
        Ok(Box::new(move || {
            let slot = slot;
            with_views("device slot write-back", |py, views| {
                let t = table(py, &slot.0, views)?;
                land.call1(py, (t,))?;
                Ok(())
            })
        }))
    }

    fn forget_partitions(&mut self) -> Result<(), String> {
        with_views("device", |py, _| {
            self.backend.call_method0(py, "forget_partitions")?;
            Ok(())
        })
    }

    fn release_host(&mut self) -> Result<(), String> {
        with_views("device", |py, _| {
            self.backend.call_method0(py, "release_host")?;
            Ok(())
        })
    }

    fn reset_counters(&mut self) -> Result<(), String> {
        with_views("device", |py, _| {
            self.backend.call_method0(py, "reset_counters")?;
            Ok(())
        })
    }

    fn counters(&mut self) -> Result<DeviceCounters, String> {
        with_views("device counters", |py, _| {
            let (busy, h2d_bytes, d2h_bytes, copy_wait, slot_in_seconds, late_loss) = self
                .backend
                .call_method0(py, "counters")?
                .extract::<(f64, u64, u64, f64, f64, f64)>(py)?;
            Ok(DeviceCounters {
                busy,
                h2d_bytes,
                d2h_bytes,
                copy_wait,
                slot_in_seconds,
                late_loss,
            })
        })
    }

    fn describe(&mut self) -> Result<String, String> {
        with_views("device", |py, _| {
            self.backend.call_method0(py, "describe")?.extract(py)
        })
    }
}

/// A victim's host slot, carried to the thread that lands its rows.
struct LeavingSlot(DeviceTable);

// SAFETY: the epoch loop has taken the slot's buffer out of the partition buffer and hands it
// to the I/O engine only after the landing returns, so nothing else reads or writes the memory
// meanwhile; the pointers stay valid (a slot keeps its buffer for the whole job).
unsafe impl Send for LeavingSlot {}

/// Imports `module`, a torch backend of `device`; a missing PyTorch is named with the way to
/// install it, any other import error is its message.
pub(crate) fn import_torch_module<'py>(
    py: Python<'py>,
    module: &str,
    device: &str,
) -> Result<Bound<'py, PyModule>, String> {
    py.import(module).map_err(|e| {
        if e.is_instance_of::<PyImportError>(py) {
            format!(
                "device = {device} needs PyTorch, which is not importable ({e}); install \
                 it (pip install 'strata[torch]') or use device = cpu"
            )
        } else {
            e.to_string()
        }
    })
}

/// The device step of `device` (see `strata_embed::DeviceFactory`): a new
/// `TorchCompute(device, matmul)`, or why not (torch missing, CUDA absent).
fn make(device: &str, matmul: &str) -> Result<Box<dyn DeviceStep>, String> {
    Python::attach(|py| {
        let module = import_torch_module(py, "strata.embed.device.backend", device)?;
        let backend = module
            .getattr("TorchCompute")
            .and_then(|c| c.call1((device, matmul)))
            .map_err(|e| e.to_string())?;
        Ok(Box::new(PyDeviceStep {
            backend: backend.unbind(),
        }) as Box<dyn DeviceStep>)
    })
}

/// The free memory of `device` and its evaluation tile's bytes (see
/// `strata_embed::DeviceMemoryInfo`), from `strata.embed.device.backend.memory_info`.
fn memory_info(device: &str) -> Result<(Option<u64>, u64), String> {
    Python::attach(|py| {
        let module = import_torch_module(py, "strata.embed.device.backend", device)?;
        module
            .getattr("memory_info")
            .and_then(|f| f.call1((device,)))
            .and_then(|r| r.extract())
            .map_err(|e| e.to_string())
    })
}

/// Registers the torch backend as the engine's device step, and how to size its budget.
pub fn register() {
    strata_embed::register_device(make);
    strata_embed::register_device_memory(memory_info);
}
