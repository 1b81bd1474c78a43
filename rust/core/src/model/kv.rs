//! Where a step's rows read and write K/V: buffers in the caches' own layouts, and per row
//! a slot list, the slots of its new tokens and a visibility mask.

use super::ModelError;

/// The axis order of a [`KvBuffer`] (the head dim is always last and contiguous).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KvOrder {
    /// `[layers, kv_heads, slots, head_dim]`: a dense cache.
    HeadsFirst,
    /// `[layers, slots, kv_heads, head_dim]`: a paged pool (slot = block * block_size +
    /// offset).
    SlotsFirst,
}

/// One K and one V tensor, C-contiguous, in `order`, with `slots` slots.
#[derive(Debug)]
pub struct KvBuffer<'a> {
    pub k: &'a mut [f32],
    pub v: &'a mut [f32],
    pub order: KvOrder,
    pub slots: usize,
}

/// Strides of one buffer, in floats.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Strides {
    layer: usize,
    head: usize,
    slot: usize,
}

impl Strides {
    #[inline(always)]
    pub(crate) fn at(self, layer: usize, head: usize, slot: usize) -> usize {
        layer * self.layer + head * self.head + slot * self.slot
    }
}

impl KvBuffer<'_> {
    /// The strides for `layers x heads x head_dim`, after checking the buffer's size.
    pub(crate) fn strides(
        &self,
        index: usize,
        layers: usize,
        heads: usize,
        head_dim: usize,
    ) -> Result<Strides, ModelError> {
        let need = layers * heads * self.slots * head_dim;
        if self.slots == 0 || self.k.len() != need || self.v.len() != need {
            return Err(ModelError::Layout {
                index,
                detail: format!(
                    "K/V must hold {layers} layers x {heads} heads x {} slots x {head_dim} \
                     ({need} values), got {} and {}",
                    self.slots,
                    self.k.len(),
                    self.v.len()
                ),
            });
        }
        Ok(match self.order {
            KvOrder::HeadsFirst => Strides {
                layer: heads * self.slots * head_dim,
                head: self.slots * head_dim,
                slot: head_dim,
            },
            KvOrder::SlotsFirst => Strides {
                layer: self.slots * heads * head_dim,
                head: head_dim,
                slot: heads * head_dim,
            },
        })
    }
}

/// A step's rows: `rows` sequences of `tokens` new tokens each.
///
/// - `positions` `[rows * tokens]`: each new token's RoPE position (a tree node's: the
///   prefix length plus its depth).
/// - `buffers` `[rows]`: the [`KvBuffer`] of each row.
/// - `slots` `[rows * width]`: the slots a row attends over, in its mask's column order
///   (typically its prefix, then its new tokens; padding columns hold any valid slot).
/// - `new_slots` `[rows * tokens]`: where each new token's K/V is written (before attention,
///   so a token that sees its own slot reads its own K/V).
/// - `mask` `[rows * tokens * width]`: true where a new token sees a column; `None`: causal,
///   token `t` sees columns `0..=width - tokens + t`. A token that sees no column gets a zero
///   attention output.
#[derive(Debug, Clone, Copy)]
pub struct StepRows<'a> {
    pub rows: usize,
    pub tokens: usize,
    pub positions: &'a [i64],
    pub buffers: &'a [i64],
    pub width: usize,
    pub slots: &'a [i64],
    pub new_slots: &'a [i64],
    pub mask: Option<&'a [bool]>,
}

impl StepRows<'_> {
    /// Every index checked against the buffers and the RoPE table (`rope_len` positions).
    pub(crate) fn check(&self, bufs: &[KvBuffer<'_>], rope_len: usize) -> Result<(), ModelError> {
        let (r, t, w) = (self.rows, self.tokens, self.width);
        if r == 0 || t == 0 || w == 0 {
            return Err(ModelError::Shape(format!(
                "a step needs rows, tokens and slots, got {r} rows of {t} tokens over {w} slots"
            )));
        }
        if self.mask.is_none() && w < t {
            return Err(ModelError::Shape(format!(
                "a causal step of {t} tokens needs at least {t} slots a row, got {w}"
            )));
        }
        super::check_size("positions", r * t, self.positions.len())?;
        super::check_size("buffers", r, self.buffers.len())?;
        super::check_size("slots", r * w, self.slots.len())?;
        super::check_size("new_slots", r * t, self.new_slots.len())?;
        if let Some(m) = self.mask {
            super::check_size("mask", r * t * w, m.len())?;
        }
        if let Some(&p) = self
            .positions
            .iter()
            .find(|&&p| p < 0 || p as u64 >= rope_len as u64)
        {
            return Err(ModelError::Position {
                position: p,
                len: rope_len,
            });
        }
        for row in 0..r {
            let b = self.buffers[row];
            if b < 0 || b as u64 >= bufs.len() as u64 {
                return Err(ModelError::Buffer {
                    row,
                    buffer: b,
                    buffers: bufs.len(),
                });
            }
            let n = bufs[b as usize].slots;
            let row_slots = self.slots[row * w..(row + 1) * w].iter();
            let new = self.new_slots[row * t..(row + 1) * t].iter();
            if let Some(&s) = row_slots
                .chain(new)
                .find(|&&s| s < 0 || s as u64 >= n as u64)
            {
                return Err(ModelError::Slot {
                    row,
                    slot: s,
                    slots: n,
                });
            }
        }
        Ok(())
    }

    /// Whether token `t` of row `r` sees column `c`.
    #[inline(always)]
    pub(crate) fn visible(&self, r: usize, t: usize, c: usize) -> bool {
        match self.mask {
            Some(m) => m[(r * self.tokens + t) * self.width + c],
            None => c + self.tokens <= self.width + t,
        }
    }
}
