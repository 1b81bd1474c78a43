//! What a constraint already decides: from a state, the bytes every valid continuation
//! starts with (its *forced* bytes), and, where it then leaves only a few choices (an enum,
//! `true`/`false`, `,` or `}`, the end of the text), each choice with its own forced tail.
//! A grammar drafter turns these byte paths into draft-tree nodes that cost nothing to guess.
//!
//! Exact by construction: a byte is forced when it is the only byte that keeps the state
//! live ([`Constraint::next_bytes`]) and the text may not end there; both are the
//! automaton's own verdicts, so every path returned is a prefix of some valid text (EOS
//! included where a path says so).

use super::{Constraint, GrammarError};

/// How far [`forced_paths`] looks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ForcedLimits {
    /// Bytes per path, choices and tails included.
    pub max_bytes: usize,
    /// A choice point with more options than this (bytes, plus EOS where the text may end)
    /// ends the paths there.
    pub max_branches: usize,
    /// Choice points expanded along one path.
    pub levels: usize,
    /// Paths returned at most (a choice that would exceed it is not expanded).
    pub max_paths: usize,
}

impl Default for ForcedLimits {
    fn default() -> Self {
        ForcedLimits {
            max_bytes: 64,
            max_branches: 4,
            levels: 2,
            max_paths: 16,
        }
    }
}

/// One way the text can go from a state: `bytes`, then EOS when `eos`. `weight` is the
/// product of `1 / options` over the choice points the path takes (the paths' weights sum
/// to 1); `choices` counts those points (0: the path is forced all the way).
#[derive(Debug, Clone, PartialEq)]
pub struct ForcedPath {
    pub bytes: Vec<u8>,
    pub eos: bool,
    pub weight: f64,
    pub choices: u32,
}

/// Count of set bits in a 256-bit byte set.
fn count(set: &[u64; 4]) -> u32 {
    set.iter().map(|w| w.count_ones()).sum()
}

/// The bytes of a 256-bit set, ascending.
fn members(set: &[u64; 4]) -> impl Iterator<Item = u8> + '_ {
    (0..=255u8).filter(move |&b| set[b as usize / 64] >> (b % 64) & 1 == 1)
}

/// The forced bytes from live state `state` (at most `max_bytes`), and the state after
/// them: bytes are taken while exactly one byte is live and the text may not end.
pub fn forced_bytes<C: Constraint>(
    c: &C,
    state: C::State,
    max_bytes: usize,
) -> Result<(Vec<u8>, C::State), GrammarError> {
    let mut out = Vec::new();
    let mut s = state;
    if s == C::DEAD || s == C::TERMINATED {
        return Ok((out, s));
    }
    while out.len() < max_bytes && !c.accepts_end(s.clone()) {
        let next = c.next_bytes(s.clone())?;
        if count(&next) != 1 {
            break;
        }
        let b = members(&next).next().expect("one member");
        s = c.step_bytes(s, &[b])?;
        out.push(b);
    }
    Ok((out, s))
}

/// Every way the text can go from live state `state` within `limits`: the forced bytes,
/// then at each choice point with at most `max_branches` options each option with its own
/// forced tail, up to `levels` choice points deep. A path ends at a choice point it does
/// not expand, at `max_bytes`, or at EOS. The longest common prefix of the paths is
/// [`forced_bytes`]'s answer. The dead and terminated states have no paths.
pub fn forced_paths<C: Constraint>(
    c: &C,
    state: C::State,
    limits: ForcedLimits,
) -> Result<Vec<ForcedPath>, GrammarError> {
    let mut out = Vec::new();
    if state == C::DEAD || state == C::TERMINATED {
        return Ok(out);
    }
    let mut stack = vec![(state, Vec::new(), 1.0f64, 0u32)];
    while let Some((s, mut bytes, weight, choices)) = stack.pop() {
        let room = limits.max_bytes.saturating_sub(bytes.len());
        let (forced, end) = forced_bytes(c, s, room)?;
        bytes.extend_from_slice(&forced);
        let next = if bytes.len() < limits.max_bytes {
            c.next_bytes(end.clone())?
        } else {
            [0; 4]
        };
        let eos = c.accepts_end(end.clone());
        let options = count(&next) as usize + eos as usize;
        // Only EOS may follow: the path ends the text.
        if options == 1 && eos {
            out.push(ForcedPath {
                bytes,
                eos: true,
                weight,
                choices,
            });
            continue;
        }
        // Paths still pending count as one each: expanding this point adds options - 1.
        let fits = out.len() + stack.len() + options <= limits.max_paths;
        if choices as usize >= limits.levels
            || options < 2
            || options > limits.max_branches
            || !fits
        {
            out.push(ForcedPath {
                bytes,
                eos: false,
                weight,
                choices,
            });
            continue;
        }
        let w = weight / options as f64;
        // Pushed in reverse, so paths come out in byte order, EOS first.
        for b in members(&next).collect::<Vec<_>>().into_iter().rev() {
            let t = c.step_bytes(end.clone(), &[b])?;
            let mut p = bytes.clone();
            p.push(b);
            stack.push((t, p, w, choices + 1));
        }
        if eos {
            out.push(ForcedPath {
                bytes: bytes.clone(),
                eos: true,
                weight: w,
                choices: choices + 1,
            });
        }
    }
    Ok(out)
}
