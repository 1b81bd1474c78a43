//! A corpus of earlier outputs shared by every request of a drafter: one [`Grams`] partition
//! per cache salt (no salt is a partition of its own), so a request drafts only from text of
//! its own tenant, under one token bound for all partitions together.
//!
//! Adding a sequence indexes only its own grams; nothing is copied per request (a proposal
//! reads a partition beside the request's own [`SuffixIndex`](super::SuffixIndex)). Past
//! `max_tokens`, whole sequences leave in least recently used order, where a sequence is
//! used when it is added and when a proposal drafts from it (the caller reports that with
//! [`SuffixCorpus::touch`], so proposals need only shared access). One bound over all
//! salts keeps memory bounded however many tenants come: a partition holds nothing once its
//! last sequence leaves.

use std::collections::BTreeMap;

use rustc_hash::FxHashMap;

use super::suffix::{check_tokens, CorpusId, Grams, Occurrence};
use super::DraftError;

/// A stored sequence: its tokens, its partition, and when it was last used.
#[derive(Debug, Clone)]
struct Stored {
    tokens: Vec<i64>,
    salt: Option<Box<[u8]>>,
    used: u64,
}

/// The grams of one salt's sequences and how many sequences it holds.
#[derive(Debug, Clone, Default)]
struct Part {
    grams: Grams,
    seqs: usize,
}

/// Earlier outputs, partitioned by cache salt, bounded to `max_tokens` tokens in all.
#[derive(Debug, Clone)]
pub struct SuffixCorpus {
    max_match: usize,
    max_tokens: usize,
    num_tokens: usize,
    next_id: CorpusId,
    clock: u64,
    seqs: FxHashMap<CorpusId, Stored>,
    /// Last use -> sequence, least recent first (each use gets a fresh tick).
    by_use: BTreeMap<u64, CorpusId>,
    unsalted: Part,
    salted: FxHashMap<Box<[u8]>, Part>,
}

/// The sequences of one salt, as a proposal reads them
/// ([`SuffixIndex::propose`](super::SuffixIndex::propose)).
#[derive(Debug, Clone, Copy)]
pub struct CorpusPart<'a> {
    corpus: &'a SuffixCorpus,
    grams: Option<&'a Grams>,
}

impl<'a> CorpusPart<'a> {
    pub fn max_match(&self) -> usize {
        self.corpus.max_match
    }

    /// (sequence id, its tokens, end) of every held occurrence of `gram`, in the order the
    /// sequences were added (ascending id), each sequence's by position.
    pub(super) fn occurrences(
        &self,
        gram: &[i64],
    ) -> impl Iterator<Item = (CorpusId, &'a [i64], usize)> + 'a {
        let seqs = &self.corpus.seqs;
        let list: &'a [Occurrence] = self.grams.map_or(&[], |g| g.get(gram));
        list.iter().filter_map(move |o| {
            let s = seqs.get(&o.seq)?; // a sequence that left: skipped until compaction
            Some((o.seq, &s.tokens[..], o.end))
        })
    }
}

impl SuffixCorpus {
    /// An empty corpus matching suffixes of up to `max_match` tokens (as the requests'
    /// indexes do) and holding at most `max_tokens` tokens.
    pub fn new(max_match: usize, max_tokens: usize) -> Result<Self, DraftError> {
        if max_match == 0 {
            return Err(DraftError::MaxMatch(max_match));
        }
        Ok(SuffixCorpus {
            max_match,
            max_tokens,
            num_tokens: 0,
            next_id: 0,
            clock: 0,
            seqs: FxHashMap::default(),
            by_use: BTreeMap::new(),
            unsalted: Part::default(),
            salted: FxHashMap::default(),
        })
    }

    pub fn max_match(&self) -> usize {
        self.max_match
    }

    pub fn max_tokens(&self) -> usize {
        self.max_tokens
    }

    /// Tokens held, over every partition.
    pub fn num_tokens(&self) -> usize {
        self.num_tokens
    }

    /// Sequences held, over every partition.
    pub fn len(&self) -> usize {
        self.seqs.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seqs.is_empty()
    }

    pub fn contains(&self, id: CorpusId) -> bool {
        self.seqs.contains_key(&id)
    }

    /// Salts with at least one sequence held (no salt counts when it holds one).
    pub fn num_partitions(&self) -> usize {
        self.salted.len() + usize::from(self.unsalted.seqs > 0)
    }

    /// The held sequence ids, least recently used first (the order they would leave in).
    pub fn ids_by_use(&self) -> Vec<CorpusId> {
        self.by_use.values().copied().collect()
    }

    /// The partition of `salt` (empty when it holds nothing).
    pub fn part(&self, salt: Option<&[u8]>) -> CorpusPart<'_> {
        let part = match salt {
            None => Some(&self.unsalted),
            Some(s) => self.salted.get(s),
        };
        CorpusPart {
            corpus: self,
            grams: part.map(|p| &p.grams),
        }
    }

    /// Add an earlier output under `salt`, first evicting least recently used sequences
    /// until it fits; returns its id. A sequence longer than the whole bound is refused.
    pub fn add(&mut self, salt: Option<&[u8]>, tokens: &[i64]) -> Result<CorpusId, DraftError> {
        check_tokens(tokens, "corpus")?;
        if tokens.len() > self.max_tokens {
            return Err(DraftError::CorpusTooLong {
                len: tokens.len(),
                max: self.max_tokens,
            });
        }
        while self.num_tokens + tokens.len() > self.max_tokens {
            let (_, &oldest) = self
                .by_use
                .first_key_value()
                .expect("tokens are held, so sequences are");
            self.remove(oldest).expect("a sequence of by_use is held");
        }
        let id = self.next_id;
        self.next_id += 1;
        let part = match salt {
            None => &mut self.unsalted,
            Some(s) => self.salted.entry(s.into()).or_default(),
        };
        part.grams.insert(id, tokens, 0, self.max_match);
        part.seqs += 1;
        let used = self.tick();
        self.by_use.insert(used, id);
        self.seqs.insert(
            id,
            Stored {
                tokens: tokens.to_vec(),
                salt: salt.map(Into::into),
                used,
            },
        );
        self.num_tokens += tokens.len();
        Ok(id)
    }

    /// Drop a held sequence and its occurrences.
    pub fn remove(&mut self, id: CorpusId) -> Result<(), DraftError> {
        let s = self.seqs.remove(&id).ok_or(DraftError::UnknownCorpus(id))?;
        self.by_use.remove(&s.used);
        self.num_tokens -= s.tokens.len();
        let seqs = &self.seqs;
        let part = match &s.salt {
            None => &mut self.unsalted,
            Some(k) => self
                .salted
                .get_mut(k)
                .expect("a held sequence's partition exists"),
        };
        part.grams
            .remove(&s.tokens, self.max_match, |q| seqs.contains_key(&q));
        part.seqs -= 1;
        if let (Some(k), 0) = (&s.salt, part.seqs) {
            self.salted.remove(k);
        }
        Ok(())
    }

    /// Mark sequences as just used (a proposal drafted from them), in the order given; ids
    /// no longer held are skipped (one may leave between a proposal and its touch).
    pub fn touch(&mut self, ids: &[CorpusId]) {
        for &id in ids {
            let used = self.clock;
            if let Some(s) = self.seqs.get_mut(&id) {
                self.by_use.remove(&s.used);
                s.used = used;
                self.by_use.insert(used, id);
                self.clock += 1;
            }
        }
    }

    fn tick(&mut self) -> u64 {
        self.clock += 1;
        self.clock - 1
    }

    /// Occurrence lists held over every partition (dead entries included).
    #[cfg(test)]
    pub(super) fn num_lists(&self) -> usize {
        self.unsalted.grams.num_lists()
            + self
                .salted
                .values()
                .map(|p| p.grams.num_lists())
                .sum::<usize>()
    }
}
