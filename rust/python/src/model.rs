//! Bindings of `specdec_core::model`: `LlamaStack` over the model's `QuantMatrix` objects
//! (shared, not copied); a step reads numpy arrays and writes the K/V, logits and hidden
//! states in place, with the GIL released.

use numpy::{
    PyReadonlyArray1, PyReadonlyArray2, PyReadonlyArray3, PyReadwriteArray1, PyReadwriteArray2,
    PyReadwriteArray4, PyUntypedArrayMethods,
};
use std::borrow::Cow;

use pyo3::prelude::*;
use specdec_core::linear::Numeric;
use specdec_core::model as core;

use crate::arrays::as_slice;

/// A step's input rows: given, or gathered from an embedding table by token id.
enum Input<'a> {
    Rows(Cow<'a, [f32]>),
    Gather(Cow<'a, [i64]>, Cow<'a, [f32]>),
}

use crate::errors::{config_arg, raise, Class, OrRaise};
use crate::linear::QuantMatrix;

/// A Llama-style decoder stack on GGUF blocks, run for a whole step in one call.
#[pyclass(module = "specdec._core", name = "LlamaStack", frozen)]
pub struct LlamaStack(core::LlamaStack);

fn weights_error(message: String) -> PyErr {
    raise(Class::Config, message)
}

#[pymethods]
impl LlamaStack {
    /// `dims`: (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab). `linears`
    /// and `biases`: per layer q/k/v, o, gate/up, down, then the head (`4 * layers + 1`);
    /// `norms`: per layer input and post-attention, then the final norm (`2 * layers + 1`);
    /// `rope_cos` / `rope_sin`: `[positions, head_dim]`, `sin` with its first half negated.
    #[new]
    #[allow(clippy::too_many_arguments)]
    fn new(
        py: Python<'_>,
        #[pyo3(from_py_with = config_arg)] dims: (usize, usize, usize, usize, usize, usize, usize),
        #[pyo3(from_py_with = config_arg)] eps: f64,
        #[pyo3(from_py_with = config_arg)] linears: Vec<PyRef<'_, QuantMatrix>>,
        #[pyo3(from_py_with = config_arg)] biases: Vec<Option<PyReadonlyArray1<'_, f32>>>,
        #[pyo3(from_py_with = config_arg)] norms: Vec<PyReadonlyArray1<'_, f32>>,
        #[pyo3(from_py_with = config_arg)] rope_cos: PyReadonlyArray2<'_, f32>,
        #[pyo3(from_py_with = config_arg)] rope_sin: PyReadonlyArray2<'_, f32>,
    ) -> PyResult<Self> {
        let (hidden, intermediate, layers, heads, kv_heads, head_dim, vocab) = dims;
        let d = core::LlamaDims {
            hidden,
            intermediate,
            layers,
            heads,
            kv_heads,
            head_dim,
            vocab,
            eps: eps as f32,
        };
        if linears.len() != 4 * layers + 1 || biases.len() != linears.len() {
            return Err(weights_error(format!(
                "{layers} layers need {} linear layers and biases, got {} and {}",
                4 * layers + 1,
                linears.len(),
                biases.len()
            )));
        }
        if norms.len() != 2 * layers + 1 {
            return Err(weights_error(format!(
                "{layers} layers need {} norms, got {}",
                2 * layers + 1,
                norms.len()
            )));
        }
        for (name, t) in [("rope_cos", &rope_cos), ("rope_sin", &rope_sin)] {
            if t.shape()[1] != head_dim {
                return Err(weights_error(format!(
                    "{name} must be [positions, {head_dim}], got {:?}",
                    t.shape()
                )));
            }
        }
        let lin = |i: usize| core::Linear {
            weight: linears[i].shared(),
            bias: biases[i].as_ref().map(|b| as_slice(b).into_owned()),
        };
        let norm = |i: usize| as_slice(&norms[i]).into_owned();
        let stack_layers = (0..layers)
            .map(|l| core::LayerWeights {
                input_norm: norm(2 * l),
                qkv: lin(4 * l),
                o: lin(4 * l + 1),
                post_norm: norm(2 * l + 1),
                gate_up: lin(4 * l + 2),
                down: lin(4 * l + 3),
            })
            .collect();
        let (cos, sin) = (
            as_slice(&rope_cos).into_owned(),
            as_slice(&rope_sin).into_owned(),
        );
        let head = lin(4 * layers);
        let final_norm = norm(2 * layers);
        let stack = py
            .detach(|| core::LlamaStack::new(d, stack_layers, final_norm, head, cos, sin))
            .or_raise()?;
        Ok(LlamaStack(stack))
    }

    /// Positions the RoPE tables cover.
    #[getter]
    fn rope_positions(&self) -> usize {
        self.0.rope_positions()
    }

    /// Whether steps time their phases (off when built).
    #[getter]
    fn profiling(&self) -> bool {
        self.0.profiling()
    }

    #[setter]
    fn set_profiling(&self, on: bool) {
        self.0.set_profiling(on);
    }

    /// The profiled steps' totals since the last `reset_profile`.
    fn profile(&self) -> StepProfile {
        self.0.profile().into()
    }

    fn reset_profile(&self) {
        self.0.reset_profile();
    }

    /// One step of `R` rows of `T` tokens (see the stub for the arguments).
    #[allow(clippy::too_many_arguments)]
    #[pyo3(signature = (x, positions, kv, buffers, slots, new_slots, mask, logits, last, capture_layers, capture_final, hidden, *, numeric = "exact", argmax = None, ids = None, embed = None, allowed = None))]
    fn step(
        &self,
        py: Python<'_>,
        #[pyo3(from_py_with = config_arg)] x: Option<PyReadonlyArray2<'_, f32>>,
        #[pyo3(from_py_with = config_arg)] positions: PyReadonlyArray1<'_, i64>,
        #[pyo3(from_py_with = config_arg)] kv: Vec<(
            PyReadwriteArray4<'_, f32>,
            PyReadwriteArray4<'_, f32>,
            bool,
        )>,
        #[pyo3(from_py_with = config_arg)] buffers: PyReadonlyArray1<'_, i64>,
        #[pyo3(from_py_with = config_arg)] slots: PyReadonlyArray2<'_, i64>,
        #[pyo3(from_py_with = config_arg)] new_slots: PyReadonlyArray2<'_, i64>,
        #[pyo3(from_py_with = config_arg)] mask: Option<PyReadonlyArray3<'_, bool>>,
        #[pyo3(from_py_with = config_arg)] mut logits: PyReadwriteArray2<'_, f32>,
        #[pyo3(from_py_with = config_arg)] last: bool,
        #[pyo3(from_py_with = config_arg)] capture_layers: Vec<usize>,
        #[pyo3(from_py_with = config_arg)] capture_final: bool,
        #[pyo3(from_py_with = config_arg)] hidden: Option<PyReadwriteArray2<'_, f32>>,
        numeric: &str,
        #[pyo3(from_py_with = config_arg)] argmax: Option<PyReadwriteArray1<'_, i64>>,
        #[pyo3(from_py_with = config_arg)] ids: Option<PyReadonlyArray1<'_, i64>>,
        #[pyo3(from_py_with = config_arg)] embed: Option<PyReadonlyArray2<'_, f32>>,
        #[pyo3(from_py_with = config_arg)] allowed: Option<PyReadonlyArray2<'_, i32>>,
    ) -> PyResult<()> {
        let Some(numeric) = Numeric::from_name(numeric) else {
            return Err(raise(
                Class::Config,
                format!("numeric must be 'exact' or 'int8', got {numeric:?}"),
            ));
        };
        let d = *self.0.dims();
        let (rows, tokens) = (new_slots.shape()[0], new_slots.shape()[1]);
        let width = slots.shape()[1];
        if slots.shape()[0] != rows {
            return Err(raise(
                Class::Verify,
                format!(
                    "slots {:?} and new_slots {:?} must have one row per row",
                    slots.shape(),
                    new_slots.shape()
                ),
            ));
        }
        if let Some(m) = &mask {
            if m.shape() != [rows, tokens, width] {
                return Err(raise(
                    Class::Verify,
                    format!(
                        "mask must be [R, T, S] = {:?}, got {:?}",
                        [rows, tokens, width],
                        m.shape()
                    ),
                ));
            }
        }
        let mut bufs = Vec::with_capacity(kv.len());
        let mut kv = kv;
        for (i, (k, v, paged)) in kv.iter_mut().enumerate() {
            let shape = k.shape().to_vec();
            let (order, want) = if *paged {
                (
                    core::KvOrder::SlotsFirst,
                    [d.layers, shape[1], d.kv_heads, d.head_dim],
                )
            } else {
                (
                    core::KvOrder::HeadsFirst,
                    [d.layers, d.kv_heads, shape[2], d.head_dim],
                )
            };
            let n = if *paged { shape[1] } else { shape[2] };
            let ok =
                shape == want && v.shape() == want && k.is_c_contiguous() && v.is_c_contiguous();
            let (Ok(ks), Ok(vs), true) = (k.as_slice_mut(), v.as_slice_mut(), ok) else {
                return Err(raise(
                    Class::KvCache,
                    format!(
                        "KV buffer {i}: K and V must be C-contiguous float32 {want:?}, got {:?} and {:?}",
                        shape,
                        v.shape()
                    ),
                ));
            };
            bufs.push(core::KvBuffer {
                k: ks,
                v: vs,
                order,
                slots: n,
            });
        }
        let (pos, buf_ids) = (as_slice(&positions), as_slice(&buffers));
        let (slot_list, new) = (as_slice(&slots), as_slice(&new_slots));
        let mask = mask.as_ref().map(as_slice);
        let input = match (&x, &ids, &embed) {
            (Some(x), None, None) => {
                if x.shape()[1] != d.hidden {
                    return Err(raise(
                        Class::Verify,
                        format!("x must be [R * T, {}], got {:?}", d.hidden, x.shape()),
                    ));
                }
                Input::Rows(as_slice(x))
            }
            (None, Some(ids), Some(table)) => {
                let (vocab, width) = (table.shape()[0], table.shape()[1]);
                if width != d.hidden || !table.is_c_contiguous() {
                    return Err(raise(
                        Class::Verify,
                        format!(
                            "embed must be a C-contiguous [vocab, {}] table, got {:?}",
                            d.hidden,
                            table.shape()
                        ),
                    ));
                }
                let ids = as_slice(ids);
                if let Some(bad) = ids.iter().find(|&&t| t < 0 || t as usize >= vocab) {
                    return Err(raise(
                        Class::Verify,
                        format!("token id {bad} is outside the embedding's {vocab} rows"),
                    ));
                }
                Input::Gather(ids, as_slice(table))
            }
            _ => {
                return Err(raise(
                    Class::Config,
                    "a step takes either x, or ids with embed".to_string(),
                ))
            }
        };
        let contiguous = |c: bool, name: &str| {
            if c {
                Ok(())
            } else {
                Err(raise(
                    Class::Config,
                    format!("{name} must be a C-contiguous array"),
                ))
            }
        };
        contiguous(logits.is_c_contiguous(), "logits")?;
        let logits = logits
            .as_slice_mut()
            .map_err(|e| raise(Class::Config, e.to_string()))?;
        let mut hidden = hidden;
        let hidden_out = match &mut hidden {
            Some(h) => {
                contiguous(h.is_c_contiguous(), "hidden")?;
                Some(
                    h.as_slice_mut()
                        .map_err(|e| raise(Class::Config, e.to_string()))?,
                )
            }
            None => None,
        };
        if hidden_out.is_none() && (capture_final || !capture_layers.is_empty()) {
            return Err(raise(
                Class::Config,
                "a capture needs a hidden output array".to_string(),
            ));
        }
        let mut argmax = argmax;
        let argmax_out = match &mut argmax {
            Some(a) => {
                let heads_out = if last { rows } else { rows * tokens };
                if a.shape() != [heads_out] {
                    return Err(raise(
                        Class::Verify,
                        format!(
                            "argmax must be [{heads_out}] (one per logits row), got {:?}",
                            a.shape()
                        ),
                    ));
                }
                contiguous(a.is_c_contiguous(), "argmax")?;
                Some(
                    a.as_slice_mut()
                        .map_err(|e| raise(Class::Config, e.to_string()))?,
                )
            }
            None => None,
        };
        let allowed: Option<Vec<u32>> = match &allowed {
            Some(a) => {
                let heads_out = if last { rows } else { rows * tokens };
                let words = d.vocab.div_ceil(32);
                if a.shape() != [heads_out, words] {
                    return Err(raise(
                        Class::Verify,
                        format!(
                            "allowed must be [{heads_out}, {words}] (a token bitmask row per logits row), got {:?}",
                            a.shape()
                        ),
                    ));
                }
                // (i32 and u32 words have the same bits.)
                Some(as_slice(a).iter().map(|&w| w as u32).collect())
            }
            None => None,
        };
        let stack = &self.0;
        py.detach(|| {
            let step_rows = core::StepRows {
                rows,
                tokens,
                positions: &pos,
                buffers: &buf_ids,
                width,
                slots: &slot_list,
                new_slots: &new,
                mask: mask.as_deref(),
            };
            let capture = hidden_out.map(|out| core::Capture {
                layers: &capture_layers,
                last_norm: capture_final,
                out,
            });
            let gathered: Vec<f32>;
            let xs: &[f32] = match &input {
                Input::Rows(x) => x,
                Input::Gather(ids, table) => {
                    let h = d.hidden;
                    gathered = ids
                        .iter()
                        .flat_map(|&t| &table[t as usize * h..(t as usize + 1) * h])
                        .copied()
                        .collect();
                    &gathered
                }
            };
            stack.step_masked(
                numeric,
                xs,
                &step_rows,
                &mut bufs,
                last,
                logits,
                capture,
                allowed.as_deref(),
            )?;
            match argmax_out {
                Some(out) => core::row_argmax(logits, d.vocab, out),
                None => Ok(()),
            }
        })
        .or_raise()
    }

    fn __repr__(&self) -> String {
        let d = self.0.dims();
        format!(
            "LlamaStack(layers={}, hidden={}, heads={}, kv_heads={}, vocab={})",
            d.layers, d.hidden, d.heads, d.kv_heads, d.vocab
        )
    }
}

/// Where a `LlamaStack`'s profiled steps spent their time, in nanoseconds.
#[pyclass(module = "specdec._core", name = "StepProfile", frozen, get_all)]
pub struct StepProfile {
    calls: u64,
    wall_ns: u64,
    matmul_ns: u64,
    attention_ns: u64,
    other_ns: u64,
}

impl From<core::StepProfile> for StepProfile {
    fn from(p: core::StepProfile) -> Self {
        StepProfile {
            calls: p.calls,
            wall_ns: p.wall_ns,
            matmul_ns: p.matmul_ns,
            attention_ns: p.attention_ns,
            other_ns: p.other_ns,
        }
    }
}

#[pymethods]
impl StepProfile {
    fn __repr__(&self) -> String {
        format!(
            "StepProfile(calls={}, wall_ns={}, matmul_ns={}, attention_ns={}, other_ns={})",
            self.calls, self.wall_ns, self.matmul_ns, self.attention_ns, self.other_ns
        )
    }
}

pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<LlamaStack>()?;
    m.add_class::<StepProfile>()?;
    Ok(())
}
