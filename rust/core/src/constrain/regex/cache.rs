//! Allowed-token bitmaps per DFA state, computed lazily by one trie walk and kept under a
//! memory cap (beyond it, masks are recomputed on every request instead of stored).

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::OnceLock;

#[derive(Debug)]
pub struct MaskCache {
    slots: Vec<OnceLock<Box<[u32]>>>,
    used_bytes: AtomicUsize,
    cap_bytes: usize,
}

impl MaskCache {
    pub fn new(num_states: usize, cap_bytes: usize) -> Self {
        MaskCache {
            slots: (0..num_states).map(|_| OnceLock::new()).collect(),
            used_bytes: AtomicUsize::new(0),
            cap_bytes,
        }
    }

    #[inline]
    pub fn get(&self, index: usize) -> Option<&[u32]> {
        self.slots[index].get().map(|b| &b[..])
    }

    /// Store a freshly computed mask if the cap allows (a concurrent duplicate is dropped).
    pub fn offer(&self, index: usize, mask: &[u32]) {
        let size = std::mem::size_of_val(mask);
        let prev = self.used_bytes.fetch_add(size, Ordering::Relaxed);
        if prev + size > self.cap_bytes || self.slots[index].set(mask.into()).is_err() {
            self.used_bytes.fetch_sub(size, Ordering::Relaxed);
        }
    }

    pub fn used_bytes(&self) -> usize {
        self.used_bytes.load(Ordering::Relaxed)
    }

    pub fn cached_states(&self) -> usize {
        self.slots.iter().filter(|s| s.get().is_some()).count()
    }
}
