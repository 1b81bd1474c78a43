//! Beam reordering: each beam continues from a chosen parent beam, sharing its blocks.

use super::error::KvError;
use super::manager::{same_len, BlockManager, Seen, SeqId};

impl BlockManager {
    /// Beam `beams[i]` becomes a copy-free continuation of `beams[parents[i]]`. Children of
    /// one parent share its blocks (their partial tail is copied on the next append); a
    /// beam nobody continues releases its blocks. All or nothing.
    pub fn reorder(&mut self, beams: &[SeqId], parents: &[usize]) -> Result<(), KvError> {
        same_len(beams.len(), "beams", parents.len(), "parents")?;
        let mut seen = Seen::with_capacity(beams.len());
        for &b in beams {
            if self.get(b)?.pending > 0 {
                return Err(KvError::PendingStep(b));
            }
            seen.first(b, |b| KvError::Invalid(format!("beam {b} appears twice")))?;
        }
        if let Some(&p) = parents.iter().find(|&&p| p >= beams.len()) {
            return Err(KvError::Invalid(format!(
                "parent index {p} out of range for {} beams",
                beams.len()
            )));
        }
        let new: Vec<_> = parents
            .iter()
            .map(|&p| self.seqs[&beams[p]].clone())
            .collect();
        // Take the new references before dropping the old ones, so a block both keep never
        // touches the free queue.
        for s in &new {
            for &b in &s.blocks {
                self.pool.incref(b);
            }
        }
        for (&beam, s) in beams.iter().zip(new) {
            let old = self.seqs.insert(beam, s).unwrap();
            for &b in old.blocks.iter().rev() {
                self.pool.decref(b);
            }
        }
        Ok(())
    }
}
