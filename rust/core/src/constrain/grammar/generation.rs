//! Chart generations: how a compiled grammar's parser states stay bounded while every
//! request keeps its own states valid and shares the cached masks of the others.
//!
//! The design, and why:
//! - Requests share one chart (the *current generation*), so equal states reached by any of
//!   them are one id with one cached mask, which is what makes the second request of a
//!   schema cheap. A chart holds at most `max_states` sets and nodes.
//! - A full chart is not reset in place (ids in live matchers would change meaning) nor
//!   evicted from (a set's items point to nodes by id, so nothing is safely removable).
//!   Instead a state whose next step needs room that its chart lacks is *carried* into a
//!   newer chart: its items and the nodes they depend on ([`Chart::export`]), which is the
//!   whole parse so far, so no request replays its text. The carried state is remembered
//!   (`moved`), so every later request at that state goes straight to the newer chart.
//! - The newer chart is the current one when it has room, else a fresh one that only this
//!   step has used so far: if the state and its step do not fit even there, that request
//!   alone needs more than `max_states` and it fails with a [`GrammarError`] naming the
//!   limit; nothing shared is marked failed. Otherwise the fresh chart becomes current.
//!   So the limit bounds each chart's memory and what one step needs (the nesting and
//!   ambiguity of the parse so far), not the length of a text.
//! - A state holds its generation (`Arc`): an old chart lives while some request's state
//!   (its history, for rollback) is in it, and is dropped with the last one. Masks are
//!   cached per chart (ids are per chart) and go with it; lexeme walks do not depend on
//!   the chart and stay cached for the grammar's life.
//!
//! [`GrammarError`]: crate::constrain::GrammarError

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};

use rustc_hash::FxHashMap;

use super::cfg::Grammar;
use super::earley::{Chart, Full, Portable, DEAD_SET};
use super::mask::{read_chart, write_chart, CacheBudget, StateMasks};
use crate::constrain::{ForcedLimits, ForcedPath};

/// Forced-path entries a generation keeps before its cache is cleared (rebuilt on demand).
const MAX_FORCED: usize = 1 << 16;

/// Per state and limits: its forced paths.
type ForcedCache = FxHashMap<(u32, ForcedLimits), Arc<[ForcedPath]>>;

/// One chart and the masks of its states.
pub struct Generation {
    /// Ordinal among the grammar's generations (for `Debug`).
    pub number: u64,
    pub chart: RwLock<Chart>,
    pub start: u32,
    pub masks: StateMasks,
    /// A step here needed a state past the cap: from now on no state is added.
    full: AtomicBool,
    /// States of this (full) chart carried to a newer generation, and where they went.
    moved: Mutex<FxHashMap<u32, (Arc<Generation>, u32)>>,
    /// Per state and limits: its forced paths (a grammar drafter asks every step).
    forced: Mutex<ForcedCache>,
}

impl std::fmt::Debug for Generation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Generation")
            .field("number", &self.number)
            .field("full", &self.is_full())
            .finish_non_exhaustive()
    }
}

impl Generation {
    /// A chart holding the start state; [`Full`] when `max_states` cannot hold even that.
    pub fn new(g: &Grammar, number: u64, budget: Arc<CacheBudget>) -> Result<Self, Full> {
        let chart = Chart::new(g)?;
        Ok(Generation {
            number,
            start: chart.start(),
            chart: RwLock::new(chart),
            masks: StateMasks::new(budget),
            full: AtomicBool::new(false),
            moved: Mutex::default(),
            forced: Mutex::default(),
        })
    }

    pub fn is_full(&self) -> bool {
        self.full.load(Ordering::Acquire)
    }

    pub fn set_full(&self) {
        self.full.store(true, Ordering::Release);
    }

    fn lock_moved(&self) -> std::sync::MutexGuard<'_, FxHashMap<u32, (Arc<Generation>, u32)>> {
        // Entries go in whole: a poisoned lock still holds only complete entries.
        self.moved.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Where state `id` was carried, if it was.
    pub fn moved_to(&self, id: u32) -> Option<(Arc<Generation>, u32)> {
        if !self.is_full() {
            return None;
        }
        self.lock_moved().get(&id).cloned()
    }

    /// Record that state `id` went to `to`; if another thread carried it first, its
    /// answer is kept and returned (all requests at the state then agree).
    pub fn set_moved(&self, id: u32, to: (Arc<Generation>, u32)) -> (Arc<Generation>, u32) {
        self.lock_moved().entry(id).or_insert(to).clone()
    }

    /// The bytes some item of state `id` can scan next.
    pub fn first_bytes(&self, g: &Grammar, id: u32) -> [u64; 4] {
        if let Some(f) = read_chart(&self.chart).cached_first_bytes(id) {
            return f;
        }
        write_chart(&self.chart).first_bytes(g, id)
    }

    fn lock_forced(&self) -> std::sync::MutexGuard<'_, ForcedCache> {
        // Entries go in whole: a poisoned lock still holds only complete entries.
        self.forced.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// State `id`'s cached forced paths under `limits`.
    pub fn cached_forced(&self, id: u32, limits: ForcedLimits) -> Option<Arc<[ForcedPath]>> {
        self.lock_forced().get(&(id, limits)).cloned()
    }

    /// Keep state `id`'s forced paths under `limits`.
    pub fn cache_forced(&self, id: u32, limits: ForcedLimits, paths: Arc<[ForcedPath]>) {
        let mut m = self.lock_forced();
        if m.len() >= MAX_FORCED {
            m.clear();
        }
        m.insert((id, limits), paths);
    }

    pub fn export(&self, id: u32) -> Portable {
        read_chart(&self.chart).export(id)
    }

    pub fn import(&self, p: &Portable) -> Result<u32, Full> {
        write_chart(&self.chart).import(p)
    }

    pub fn accepts(&self, id: u32) -> bool {
        read_chart(&self.chart).accepts(id)
    }

    /// Run `bytes` from live state `id`: under the shared lock while the transitions are
    /// cached (steps from several threads go on together), the rest under the exclusive one.
    pub fn run(&self, g: &Grammar, mut id: u32, bytes: &[u8]) -> Result<u32, Full> {
        let mut rest = bytes;
        {
            let chart = read_chart(&self.chart);
            while let Some((&b, tail)) = rest.split_first() {
                if id == DEAD_SET {
                    return Ok(DEAD_SET);
                }
                match chart.cached_step(id, b) {
                    Some(t) => id = t,
                    None => break,
                }
                rest = tail;
            }
        }
        if rest.is_empty() {
            return Ok(id);
        }
        write_chart(&self.chart).run(g, id, rest)
    }
}

impl Drop for Generation {
    // Unlink iteratively: a long chain of carried states must not recurse once per chart.
    fn drop(&mut self) {
        let mut next = Vec::new();
        let take = |g: &mut Generation, next: &mut Vec<Arc<Generation>>| {
            let moved = g.moved.get_mut().unwrap_or_else(|e| e.into_inner());
            next.extend(std::mem::take(moved).into_values().map(|(g, _)| g));
        };
        take(self, &mut next);
        while let Some(g) = next.pop() {
            if let Ok(mut g) = Arc::try_unwrap(g) {
                take(&mut g, &mut next);
            }
        }
    }
}
