//! Guessing the next tokens with a draft model (speculative decoding's other source, beside
//! prompt lookup in `ngram`): a smaller model of the same tokenizer runs ahead of the target
//! and its greedy tokens are the guess, which the target checks in one pass as it checks any
//! guess (`Engine::step`).
//!
//! The draft keeps its own KV cache, a block table a sequence. Each step it first computes
//! what the target kept since it last ran (the last generated token, and any of its own guesses
//! the target rejected are rolled back: its table's `len` cut to the tokens both agree on, as
//! the target rolls back its own), then one token a pass for the rest of the guess, every
//! speculating sequence in the same pass. A greedy draft is a point mass, so the target's
//! accept rule (keep a guess where its own draw agrees) keeps the target's distribution.

use std::collections::HashMap;

use super::sequence::RequestId;
use crate::batch::{Batch, SeqChunk};
use crate::error::{Error, Result};
use crate::kv::block_manager::{BlockManager, BlockTable};
use crate::runner::Forward;

/// One sequence's ask of the draft: its tokens so far and how many to guess.
pub struct GuessAsk<'a> {
    pub id: RequestId,
    pub tokens: &'a [u32],
    pub k: usize,
}

/// Where guessed tokens come from, besides prompt lookup.
pub trait Guesser {
    /// For each ask, up to `k` guessed tokens into `out` (an empty guess where none could be
    /// made, for instance when the draft's cache is full).
    fn guess(&mut self, asks: &[GuessAsk], out: &mut Vec<Vec<u32>>) -> Result<()>;

    /// Keeps only the sequences `live` says still run; the others' caches are freed.
    fn retain(&mut self, live: &dyn Fn(RequestId) -> bool);
}

/// A draft model's state beside the target's.
struct Drafted {
    table: BlockTable,
    /// The tokens whose keys and values the draft's cache holds (`table.len` of them).
    fed: Vec<u32>,
}

pub struct DraftModel<D: Forward> {
    model: D,
    blocks: BlockManager,
    seqs: HashMap<RequestId, Drafted>,
    batch: Batch,
}

impl<D: Forward> DraftModel<D> {
    /// `model` drafts for a target of `target_vocab` tokens: its vocabulary must be the
    /// same size (the same tokenizer; a draft with extra ids could guess one the target lacks).
    pub fn new(model: D, target_vocab: usize) -> Result<DraftModel<D>> {
        let limits = model.limits();
        if limits.vocab_size != target_vocab {
            return Err(Error::Usage(format!(
                "the draft model's vocabulary has {} tokens, the model's {target_vocab}: a draft must share its tokenizer",
                limits.vocab_size
            )));
        }
        Ok(DraftModel {
            blocks: BlockManager::new(limits.n_blocks, false),
            model,
            seqs: HashMap::new(),
            batch: Batch::default(),
        })
    }

    /// Rolls each ask's cache back to what it shares with the ask's tokens and reserves
    /// room for the rest and its guess. Returns, per ask, the first token to feed (`None`:
    /// no room, no guess).
    fn prepare(&mut self, asks: &[GuessAsk]) -> Vec<Option<usize>> {
        let max_ctx = self.model.limits().max_context;
        asks.iter()
            .map(|a| {
                let d = self.seqs.entry(a.id).or_insert_with(|| Drafted {
                    table: BlockTable::default(),
                    fed: vec![],
                });
                let same = d
                    .fed
                    .iter()
                    .zip(a.tokens)
                    .take_while(|(x, y)| x == y)
                    .count();
                // The last token is always fed: its logits give the first guess.
                let from = same.min(a.tokens.len() - 1);
                d.fed.truncate(from);
                d.table.len = from;
                let want = a.tokens.len() + a.k;
                let fits =
                    a.k > 0 && want <= max_ctx && self.blocks.reserve(&mut d.table, want).is_ok();
                fits.then_some(from)
            })
            .collect()
    }
}

impl<D: Forward> Guesser for DraftModel<D> {
    fn guess(&mut self, asks: &[GuessAsk], out: &mut Vec<Vec<u32>>) -> Result<()> {
        out.clear();
        out.resize(asks.len(), vec![]);
        let starts = self.prepare(asks);
        // `pending[i]`: the tokens ask i feeds next (its catch-up, then its last guess).
        let mut pending: Vec<Option<Vec<u32>>> = asks
            .iter()
            .zip(&starts)
            .map(|(a, s)| s.map(|from| a.tokens[from..].to_vec()))
            .collect();
        let limits = self.model.limits();
        loop {
            // A pass: each sequence's pending tokens, as many as the draft takes in one pass;
            // a catch-up cut short computes its part and guesses nothing yet.
            let mut budget = limits.max_batch_tokens;
            let mut taken = vec![]; // (ask, tokens, whether it reaches the end)
            for (i, p) in pending.iter().enumerate() {
                let Some(p) = p else { continue };
                if budget == 0 || taken.len() == limits.max_batch_seqs {
                    break;
                }
                let n = p.len().min(budget);
                budget -= n;
                taken.push((i, n, n == p.len()));
            }
            if taken.is_empty() {
                break;
            }
            let chunks: Vec<SeqChunk> = taken
                .iter()
                .map(|&(i, n, whole)| SeqChunk {
                    table: &self.seqs[&asks[i].id].table,
                    tokens: &pending[i].as_deref().unwrap_or_default()[..n],
                    logits: usize::from(whole),
                })
                .collect();
            self.batch.fill(&chunks, false);
            let next = self.model.forward_greedy(&self.batch)?;
            let mut rows = next.iter();
            for &(i, n, whole) in &taken {
                let d = self.seqs.get_mut(&asks[i].id).expect("prepared");
                let p = pending[i].take().unwrap_or_default();
                d.table.len += n;
                d.fed.extend_from_slice(&p[..n]);
                if !whole {
                    pending[i] = Some(p[n..].to_vec());
                    continue;
                }
                let &t = rows.next().expect("a row a chunk that reaches its end");
                out[i].push(t);
                if out[i].len() < asks[i].k {
                    pending[i] = Some(vec![t]);
                }
            }
        }
        Ok(())
    }

    fn retain(&mut self, live: &dyn Fn(RequestId) -> bool) {
        let blocks = &mut self.blocks;
        self.seqs.retain(|&id, d| {
            let keep = live(id);
            if !keep {
                blocks.release(&mut d.table);
            }
            keep
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::fake::FakeModel;

    /// The fake model drafting for itself guesses what it will choose: its guesses are the
    /// greedy continuation, whatever was fed before, and a rejected tail is rolled back.
    #[test]
    fn a_draft_catches_up_and_rolls_back() {
        let mut d = DraftModel::new(FakeModel::new(7, 256, 32, 64), 7).unwrap();
        let mut alone = FakeModel::new(7, 256, 32, 64);
        let greedy = |m: &mut FakeModel, tokens: &[u32], k: usize| {
            let mut table = BlockTable::default();
            let mut blocks = BlockManager::new(32, false);
            blocks.reserve(&mut table, tokens.len() + k).unwrap();
            let (mut out, mut feed) = (vec![], tokens.to_vec());
            let mut batch = Batch::default();
            for _ in 0..k {
                let chunk = SeqChunk {
                    table: &table,
                    tokens: &feed,
                    logits: 1,
                };
                batch.fill(&[chunk], false);
                let t = m.forward_greedy(&batch).unwrap()[0];
                table.len += feed.len();
                out.push(t);
                feed = vec![t];
            }
            out
        };
        let mut out = vec![];
        let prompt = [1, 2, 3, 4, 5];
        let ask = |tokens, k| GuessAsk { id: 9, tokens, k };
        d.guess(&[ask(&prompt, 3)], &mut out).unwrap();
        assert_eq!(out[0], greedy(&mut alone, &prompt, 3));
        // The target kept the first guess and chose 6 after it: the draft's second and third
        // guesses are rolled back and it goes on from 6.
        let kept = [1, 2, 3, 4, 5, out[0][0], 6];
        d.guess(&[ask(&kept, 4)], &mut out).unwrap();
        assert_eq!(out[0], greedy(&mut alone, &kept, 4));
        assert_eq!(d.seqs[&9].table.len, kept.len() + 3);
        d.retain(&|_| false);
        assert!(d.seqs.is_empty());
        assert_eq!(d.blocks.n_free(), 32, "every block back");
        assert!(DraftModel::new(FakeModel::new(8, 256, 32, 64), 7).is_err());
    }
}
