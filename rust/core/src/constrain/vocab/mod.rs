//! A tokenizer vocabulary as exact bytes per token (partial UTF-8 kept as is), plus the ids
//! that end generation (EOS) and the special ids that never match text.

use base64::Engine;
use serde::Deserialize;

mod subtree;
mod trie;
pub mod utf8;

pub use subtree::{Allowed, SubtreeSummary};
pub(crate) use trie::heights_below;
pub use trie::{TokenTrie, TrieNode};

use super::grammar::SharedWalks;
use super::GrammarError;

/// Token bytes in one flat buffer (`offsets[i]..offsets[i+1]`), built once and shared.
#[derive(Debug)]
pub struct Vocabulary {
    vocab_size: usize,
    bytes: Vec<u8>,
    offsets: Vec<u32>,
    /// True for ids that carry text; special/control ids and padding ids are false.
    has_bytes: Vec<bool>,
    eos: Vec<u32>,
    is_eos: Vec<bool>,
    trie: TokenTrie,
    /// Trie walks shared by every grammar compiled against this vocabulary.
    walks: SharedWalks,
}

impl Vocabulary {
    /// Build from per-id bytes (`None` = special token without text). `vocab_size` may exceed
    /// `tokens.len()` (a model's padded embedding); the extra ids never match.
    pub fn new(
        tokens: Vec<Option<Vec<u8>>>,
        eos_ids: &[i64],
        vocab_size: Option<usize>,
    ) -> Result<Self, GrammarError> {
        let vocab_size = vocab_size.unwrap_or(tokens.len());
        if vocab_size < tokens.len() {
            return Err(GrammarError::Vocab(format!(
                "vocab_size {vocab_size} is smaller than the {} tokens given",
                tokens.len()
            )));
        }
        if vocab_size == 0 || vocab_size > i32::MAX as usize {
            return Err(GrammarError::Vocab(format!(
                "vocab_size {vocab_size} out of range"
            )));
        }
        let mut is_eos = vec![false; vocab_size];
        let mut eos = Vec::with_capacity(eos_ids.len());
        for &e in eos_ids {
            if e < 0 || e as usize >= vocab_size {
                return Err(GrammarError::Vocab(format!(
                    "EOS id {e} is outside [0, {vocab_size})"
                )));
            }
            if !is_eos[e as usize] {
                is_eos[e as usize] = true;
                eos.push(e as u32);
            }
        }
        let total: usize = tokens.iter().map(|t| t.as_ref().map_or(0, Vec::len)).sum();
        if total > u32::MAX as usize {
            return Err(GrammarError::Vocab("token bytes exceed 4 GiB".into()));
        }
        let mut bytes = Vec::with_capacity(total);
        let mut offsets = Vec::with_capacity(vocab_size + 1);
        let mut has_bytes = vec![false; vocab_size];
        offsets.push(0u32);
        for i in 0..vocab_size {
            match tokens.get(i) {
                // EOS ids are handled by the automaton's accepting states, never as text.
                Some(Some(b)) if !b.is_empty() && !is_eos[i] => {
                    bytes.extend_from_slice(b);
                    has_bytes[i] = true;
                }
                _ => {}
            }
            offsets.push(bytes.len() as u32);
        }
        let mut v = Vocabulary {
            vocab_size,
            bytes,
            offsets,
            has_bytes,
            eos,
            is_eos,
            trie: TokenTrie::default(),
            walks: SharedWalks::default(),
        };
        v.trie = TokenTrie::build(&v);
        v.walks = SharedWalks::seeded(&v.trie, v.words());
        Ok(v)
    }

    /// Parse a Tekken (tiktoken-style) JSON file as shipped by `mistral_common`: the first
    /// `default_num_special_tokens` ids are special, then ranks in order, cut at
    /// `default_vocab_size`. EOS defaults to the `</s>` special token (id 2).
    pub fn from_tekken_json(data: &[u8], eos_ids: Option<&[i64]>) -> Result<Self, GrammarError> {
        #[derive(Deserialize)]
        struct Config {
            default_vocab_size: Option<usize>,
            default_num_special_tokens: Option<usize>,
        }
        #[derive(Deserialize)]
        struct Entry {
            token_bytes: String,
        }
        #[derive(Deserialize)]
        struct Special {
            rank: usize,
            token_str: String,
        }
        #[derive(Deserialize)]
        struct Tekken {
            config: Config,
            vocab: Vec<Entry>,
            #[serde(default)]
            special_tokens: Vec<Special>,
        }
        let t: Tekken = serde_json::from_slice(data)
            .map_err(|e| GrammarError::Vocab(format!("not a Tekken JSON file: {e}")))?;
        let n_special = t
            .config
            .default_num_special_tokens
            .unwrap_or(t.special_tokens.len());
        let size = t
            .config
            .default_vocab_size
            .unwrap_or(n_special + t.vocab.len());
        if size < n_special {
            return Err(GrammarError::Vocab(
                "default_vocab_size < num special tokens".into(),
            ));
        }
        let n_ranks = (size - n_special).min(t.vocab.len());
        let mut tokens: Vec<Option<Vec<u8>>> = vec![None; n_special];
        let b64 = base64::engine::general_purpose::STANDARD;
        for (r, e) in t.vocab[..n_ranks].iter().enumerate() {
            let b = b64
                .decode(&e.token_bytes)
                .map_err(|err| GrammarError::Vocab(format!("rank {r}: bad base64: {err}")))?;
            tokens.push(Some(b));
        }
        let eos: Vec<i64> = match eos_ids {
            Some(e) => e.to_vec(),
            None => {
                let named = t.special_tokens.iter().find(|s| s.token_str == "</s>");
                vec![named.map_or(2, |s| s.rank as i64)]
            }
        };
        Vocabulary::new(tokens, &eos, Some(size))
    }

    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// 32-bit words per bitmask row.
    pub fn words(&self) -> usize {
        self.vocab_size.div_ceil(32)
    }

    /// The token's text bytes (empty for special, EOS and padding ids).
    #[inline]
    pub fn token_bytes(&self, id: usize) -> &[u8] {
        &self.bytes[self.offsets[id] as usize..self.offsets[id + 1] as usize]
    }

    #[inline]
    pub fn has_bytes(&self, id: usize) -> bool {
        self.has_bytes[id]
    }

    #[inline]
    pub fn is_eos(&self, id: usize) -> bool {
        self.is_eos[id]
    }

    pub fn eos_ids(&self) -> &[u32] {
        &self.eos
    }

    pub fn trie(&self) -> &TokenTrie {
        &self.trie
    }

    pub fn walks(&self) -> &SharedWalks {
        &self.walks
    }

    /// Check a token id from outside.
    #[inline]
    pub fn check(&self, token: i64) -> Result<usize, GrammarError> {
        if token >= 0 && (token as u64) < self.vocab_size as u64 {
            Ok(token as usize)
        } else {
            Err(GrammarError::TokenOutOfRange {
                token,
                vocab_size: self.vocab_size,
            })
        }
    }
}
