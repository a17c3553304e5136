//! The engine loop a server drives from its own thread: requests go in (`add_request`,
//! between any two steps), each `step` runs one forward pass over what the scheduler chose
//! and returns every request's new token, `abort` ends a request at once.

use super::draft::{GuessAsk, Guesser};
use super::guess_budget::GuessBudget;
use super::ngram;
use super::scheduler::{ScheduledStep, Scheduler, SchedulerConfig};
use super::sequence::{FinishReason, RequestId, Sequence, Status, StopConditions};
use crate::batch::{Batch, SeqChunk};
use crate::constrain::Constraint;
use crate::error::{Error, Result};
use crate::kv::block_manager::{BLOCK_SIZE, BlockManager};
use crate::runner::{Forward, Limits, Runner};
use crate::sampler::{Choices, SamplingParams};

#[derive(Clone, Debug)]
pub struct EngineOptions {
    /// Most tokens in one step: decode tokens first, prompt chunks fill the rest.
    pub token_budget: usize,
    /// Most sequences in one step (lowered to what the runner takes).
    pub max_seqs: usize,
    /// Keep full KV blocks findable by their tokens, so prompts that share a prefix compute
    /// it once.
    pub prefix_cache: bool,
    /// The model's end-of-sequence ids: every request stops at them unless it says otherwise.
    pub eos: Vec<u32>,
    /// Speculative decoding's guesses take a step's rows only while it holds fewer than this
    /// many tokens (`SchedulerConfig::guess_rows`).
    pub guess_rows: usize,
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            token_budget: DEFAULT_TOKEN_BUDGET,
            max_seqs: 256,
            prefix_cache: true,
            eos: vec![],
            guess_rows: DEFAULT_GUESS_ROWS,
        }
    }
}

pub const DEFAULT_TOKEN_BUDGET: usize = 512;

/// Rows a step may fill with guessed tokens (decode rows and prompt tokens count too). On an
/// H100 over the Llama-3-8B shape in bf16, rows that share the weights' read cost little: 16
/// rows of one sequence 1.26x a decode step, 8 sequences 1.17x, 64 sequences 1.71x
/// (BENCHMARKS.md, "Checking guessed tokens" and "Batched decode"); past a few tens of rows
/// they cost compute, and a large batch's own decodes keep the GPU busy without guesses.
pub const DEFAULT_GUESS_ROWS: usize = 32;

/// What a request asks for besides its prompt.
#[derive(Clone, Debug)]
pub struct RequestParams {
    pub sampling: SamplingParams,
    /// Most tokens to generate (at least 1).
    pub max_tokens: usize,
    /// More ids that end the request, as an end-of-sequence does.
    pub stop_token_ids: Vec<u32>,
    /// Generate past the model's end-of-sequence ids.
    pub ignore_eos: bool,
    /// Report each chosen token's log-probability and those of this many most likely
    /// tokens (at most `MAX_TOP_LOGPROBS`); `None`: none. A request that asks takes the
    /// logits path, never `forward_greedy`.
    pub logprobs: Option<usize>,
    /// A grammar the output must match (`constrain`): each step's choice is masked to the
    /// tokens it allows, and the request ends where the grammar does.
    pub constraint: Option<Constraint>,
    /// Speculative decoding: guess up to this many tokens a step by prompt lookup
    /// (`ngram`), all checked in the step's one pass; 0: off. The output is the one the
    /// request would have had without (each row chooses as the unguessed step would).
    /// Requests with a grammar or log-probabilities do not speculate.
    pub speculate: usize,
}

/// Most alternatives a request may ask log-probabilities of (OpenAI's `top_logprobs` limit).
pub const MAX_TOP_LOGPROBS: usize = 20;

impl Default for RequestParams {
    fn default() -> Self {
        RequestParams {
            sampling: SamplingParams::default(),
            max_tokens: 16,
            stop_token_ids: vec![],
            ignore_eos: false,
            logprobs: None,
            constraint: None,
            speculate: 0,
        }
    }
}

/// One request's news from a step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepOutput {
    pub id: RequestId,
    /// The token generated this step; `None` when the step sampled a stop token (which is
    /// not part of the output).
    pub token: Option<u32>,
    /// Set when the request has ended: its blocks are already released.
    pub finish: Option<FinishReason>,
    /// The sampled token's log-probability and the top alternatives', when the request
    /// asked (`RequestParams::logprobs`).
    pub logprobs: Option<TokenLogprobs>,
}

/// Log-probabilities under the model's own distribution: the softmax of the raw logits,
/// before penalties, temperature and filters (what OpenAI and vLLM report by default).
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The sampled token (a stop token included) and its log-probability.
    pub token: u32,
    pub logprob: f32,
    /// The most likely tokens with theirs, most likely first (ties: lower id first).
    pub top: Vec<(u32, f32)>,
}

/// A snapshot of the engine's state and counters.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EngineStats {
    pub running: usize,
    pub waiting: usize,
    /// Blocks held by sequences.
    pub blocks_used: usize,
    /// Blocks never cached (or forgotten): taken first.
    pub blocks_free: usize,
    /// Blocks owned by no one whose content is kept for the prefix cache; evicted, least
    /// recently used first, when the free ones run out.
    pub blocks_cached: usize,
    pub prefix_lookups: u64,
    /// Of the tokens looked up in the prefix cache, the share found there.
    pub prefix_hit_rate: f64,
    pub prefix_hit_tokens: u64,
    pub preemptions: u64,
    /// Prompt tokens of the requests added.
    pub prompt_tokens: u64,
    /// Tokens sampled (stop tokens included).
    pub generated_tokens: u64,
    pub steps: u64,
    /// Tokens guessed for speculative decoding, and of those, the ones the model agreed
    /// with (kept without a pass of their own).
    pub drafted_tokens: u64,
    pub accepted_tokens: u64,
}

pub struct Engine<M: Forward = Runner> {
    model: M,
    limits: Limits,
    scheduler: Scheduler,
    eos: Vec<u32>,
    batch: Batch,
    /// `[rows, vocab]` the step's logits, copied out to be penalised and drawn from when
    /// log-probabilities are wanted (the raw logits give those).
    logits: Vec<f32>,
    /// How each row of the step chooses its token.
    choices: Choices,
    /// `[vocab]` (logit, token) pairs, for the top log-probabilities.
    ranked: Vec<(f32, u32)>,
    /// The last step's log-probabilities, one per sampled chunk (`None` where not asked).
    logprobs: Vec<Option<TokenLogprobs>>,
    /// `[rows]` which rows of the step's batch are generated tokens (`Forward::set_generated`)
    generated: Vec<bool>,
    next_id: RequestId,
    prompt_tokens: u64,
    generated_tokens: u64,
    steps: u64,
    drafted_tokens: u64,
    accepted_tokens: u64,
    /// Scratch for a sequence's guess.
    guess: Vec<u32>,
    /// A draft model guessing instead of prompt lookup (`set_drafter`), and its guesses.
    drafter: Option<Box<dyn Guesser>>,
    drafted: Vec<Vec<u32>>,
}

impl<M: Forward> Engine<M> {
    pub fn new(model: M, opts: EngineOptions) -> Result<Engine<M>> {
        let limits = model.limits();
        if opts.token_budget == 0 {
            return Err(Error::Usage("--token-budget must be at least 1".into()));
        }
        // A runner may take fewer tokens a pass than the budget (a small model's context,
        // one prompt's pool): a step never needs more than it takes.
        let token_budget = opts.token_budget.min(limits.max_batch_tokens);
        if opts.max_seqs == 0 {
            return Err(Error::Usage(
                "the engine must run at least one sequence".into(),
            ));
        }
        let config = SchedulerConfig {
            token_budget,
            max_seqs: opts.max_seqs.min(limits.max_batch_seqs),
            guess_rows: opts.guess_rows,
            window: limits.window,
        };
        let blocks = BlockManager::new(limits.n_blocks, opts.prefix_cache);
        Ok(Engine {
            model,
            limits,
            scheduler: Scheduler::new(config, blocks),
            eos: opts.eos,
            batch: Batch::default(),
            logits: vec![],
            choices: Choices::default(),
            ranked: vec![],
            logprobs: vec![],
            generated: vec![],
            next_id: 0,
            prompt_tokens: 0,
            generated_tokens: 0,
            steps: 0,
            drafted_tokens: 0,
            accepted_tokens: 0,
            guess: vec![],
            drafter: None,
            drafted: vec![],
        })
    }

    /// Guesses come from `drafter` (a draft model) from now on, rather than from prompt
    /// lookup, for every request that speculates.
    pub fn set_drafter(&mut self, drafter: Box<dyn Guesser>) {
        self.drafter = Some(drafter);
    }

    pub fn model(&self) -> &M {
        &self.model
    }

    pub fn model_mut(&mut self) -> &mut M {
        &mut self.model
    }

    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// The batch the last step ran (for measuring tools: its rows, positions, sequences).
    pub fn last_batch(&self) -> &Batch {
        &self.batch
    }

    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// Queues a request. Everything that could stop it later is checked now: a request that
    /// is accepted can always finish (alone, the pool holds it).
    pub fn add_request(&mut self, prompt: Vec<u32>, params: RequestParams) -> Result<RequestId> {
        self.check(&prompt, &params)?;
        Ok(self.queue(prompt, params, None))
    }

    /// Queues several requests on one prompt (OpenAI's `n` choices), one per entry of
    /// `params`, all checked before any is queued. The prompt is computed once: the others
    /// wait until the first has computed it, then take its full blocks from the prefix cache
    /// (without the prefix cache, each computes its own).
    pub fn add_group(
        &mut self,
        prompt: Vec<u32>,
        params: Vec<RequestParams>,
    ) -> Result<Vec<RequestId>> {
        if params.is_empty() {
            return Err(Error::InvalidRequest("a group needs a request".into()));
        }
        for p in &params {
            self.check(&prompt, p)?;
        }
        // Only full blocks before the last token are shared: a shorter prompt gains nothing.
        let cache = self.scheduler.blocks.prefix.enabled();
        let shares = cache && params.len() > 1 && prompt.len() > BLOCK_SIZE;
        let mut ids = Vec::with_capacity(params.len());
        for p in params {
            let leader = ids.first().copied().filter(|_| shares);
            ids.push(self.queue(prompt.clone(), p, leader));
        }
        Ok(ids)
    }

    fn queue(
        &mut self,
        prompt: Vec<u32>,
        params: RequestParams,
        wait_for: Option<RequestId>,
    ) -> RequestId {
        let id = self.next_id;
        self.next_id += 1;
        self.prompt_tokens += prompt.len() as u64;
        let stop = StopConditions {
            max_tokens: params.max_tokens,
            eos: if params.ignore_eos {
                vec![]
            } else {
                self.eos.clone()
            },
            stop_token_ids: params.stop_token_ids,
        };
        let mut seq = Sequence::new(id, prompt, params.sampling, stop);
        seq.logprobs = params.logprobs;
        let speculate = match seq.logprobs.is_some() || params.constraint.is_some() {
            true => 0,
            false => params.speculate,
        };
        seq.guesses = GuessBudget::new(speculate);
        seq.constraint = params.constraint;
        seq.wait_for = wait_for;
        self.scheduler.add(seq);
        id
    }

    fn check(&self, prompt: &[u32], params: &RequestParams) -> Result<()> {
        let l = &self.limits;
        let bad = |why: String| Err(Error::InvalidRequest(why));
        if prompt.is_empty() {
            return bad("the prompt has no tokens".into());
        }
        let vocab = l.vocab_size;
        if let Some(i) = prompt.iter().position(|&t| t as usize >= vocab) {
            return bad(format!(
                "prompt token {i} is id {}, outside the model's vocabulary of {vocab}",
                prompt[i]
            ));
        }
        if let Some(t) = params.stop_token_ids.iter().find(|&&t| t as usize >= vocab) {
            return bad(format!(
                "stop token id {t} is outside the model's vocabulary of {vocab}"
            ));
        }
        if params.max_tokens == 0 {
            return bad("max_tokens must be at least 1".into());
        }
        if let Some(k) = params.logprobs
            && k > MAX_TOP_LOGPROBS
        {
            return bad(format!(
                "at most {MAX_TOP_LOGPROBS} top log-probabilities, {k} asked"
            ));
        }
        params
            .sampling
            .validate()
            .map_err(|e| Error::InvalidRequest(e.to_string()))?;
        let what = if l.max_context < l.model_context {
            "the KV cache (--kv-blocks)"
        } else {
            "the model's context"
        };
        if prompt.len() > l.max_context {
            return Err(Error::PromptTooLong {
                tokens: prompt.len(),
                limit: l.max_context,
                what,
            });
        }
        // The last token generated is never run through the model: it needs no KV.
        let kv = prompt.len() + params.max_tokens - 1;
        if kv > l.max_context {
            return bad(format!(
                "a prompt of {} tokens with max_tokens {} needs {kv} positions, but {what} holds only {}",
                prompt.len(),
                params.max_tokens,
                l.max_context
            ));
        }
        Ok(())
    }

    pub fn has_work(&self) -> bool {
        self.scheduler.has_work()
    }

    /// Ends a request at once and releases its blocks. Returns whether it was still there.
    pub fn abort(&mut self, id: RequestId) -> bool {
        self.scheduler.abort(id)
    }

    /// One forward pass over the scheduler's choice. Returns a `StepOutput` for every request
    /// that sampled a token; requests whose prompt chunk did not reach the end return none.
    pub fn step(&mut self) -> Result<Vec<StepOutput>> {
        self.guess_ahead()?;
        let step = self.scheduler.schedule();
        if step.chunks.is_empty() {
            // With work left, some sequence can always run (a request is accepted only if it
            // fits the pool alone): an empty step would be a scheduler bug, and a caller
            // looping on `has_work` would spin forever.
            assert!(
                !self.has_work(),
                "work left, but nothing could be scheduled"
            );
            return Ok(vec![]);
        }
        self.steps += 1;
        let ids = self.run(&step)?;
        // Each chunk that wants logits has one row per guessed token and one for the next:
        // the guesses come off the sequence before `advance`, which then counts only real
        // tokens as computed.
        let mut checks = vec![];
        let mut row = 0;
        for c in step.chunks.iter().filter(|c| c.logits) {
            let drafts = self.scheduler.running_mut()[c.seq].take_drafts();
            checks.push((c.seq, row, drafts));
            row += checks.last().map_or(0, |(_, _, d)| d.len()) + 1;
        }
        debug_assert_eq!(row, ids.len());
        self.scheduler.advance(&step);

        let mut outputs = Vec::with_capacity(ids.len());
        let mut logprobs = std::mem::take(&mut self.logprobs);
        logprobs.resize(ids.len(), None);
        for (seq, row, drafts) in checks {
            // Row j chose what follows guess j - 1 as the step without guesses would have:
            // the guesses it agrees with are kept, then its own choice after the last.
            let rows = &ids[row..row + drafts.len() + 1];
            let agreed = drafts.iter().zip(rows).take_while(|(d, r)| d == r).count();
            self.drafted_tokens += drafts.len() as u64;
            self.accepted_tokens += agreed as u64;
            let seq = &mut self.scheduler.running_mut()[seq];
            seq.guesses.record(drafts.len(), agreed);
            let computed = seq.computed();
            for (j, &token) in rows[..=agreed].iter().enumerate() {
                self.generated_tokens += 1;
                let (kept, finish) = seq.push(token);
                if let Some(reason) = finish {
                    seq.status = Status::Finished(reason);
                }
                outputs.push(StepOutput {
                    id: seq.id,
                    token: kept.then_some(token),
                    finish,
                    logprobs: logprobs[row + j].take(),
                });
                if finish.is_some() {
                    break;
                }
            }
            // The agreed guesses' keys and values were computed with them: only the new
            // last token is left to compute.
            if seq.status == Status::Running && agreed > 0 {
                seq.table.len = computed + agreed;
                debug_assert_eq!(seq.pending(), 1);
            }
        }
        logprobs.clear();
        self.logprobs = logprobs;
        self.scheduler.retire_finished();
        Ok(outputs)
    }

    /// Guesses the next tokens of every decoding sequence that speculates (the draft model's,
    /// or prompt lookup's), within what it may still generate.
    fn guess_ahead(&mut self) -> Result<()> {
        if self.drafter.is_some() {
            return self.draft_ahead();
        }
        for seq in self.scheduler.running_mut() {
            if seq.guesses.most == 0 || seq.pending() != 1 || seq.drafts() > 0 {
                continue;
            }
            // The last token generated needs no room: guesses stop one short of max_tokens.
            let room = seq
                .stop
                .max_tokens
                .saturating_sub(seq.generated().len() + 1);
            let k = seq.guesses.take().min(room);
            ngram::propose(seq.tokens(), k, &mut self.guess);
            if !self.guess.is_empty() {
                seq.add_drafts(&self.guess);
            }
        }
        Ok(())
    }

    /// `guess_ahead` with the draft model: every speculating sequence in its passes at once.
    fn draft_ahead(&mut self) -> Result<()> {
        let drafter = self.drafter.as_mut().expect("a drafter");
        let running = self.scheduler.running_mut();
        // Sequences that finished, were aborted or preempted free their draft caches.
        let live: std::collections::HashSet<RequestId> = running.iter().map(|s| s.id).collect();
        drafter.retain(&|id| live.contains(&id));
        let mut asking = vec![];
        let asks: Vec<GuessAsk> = running
            .iter_mut()
            .enumerate()
            .filter(|(_, s)| s.guesses.most > 0 && s.pending() == 1 && s.drafts() == 0)
            .filter_map(|(i, s)| {
                let room = s.stop.max_tokens.saturating_sub(s.generated().len() + 1);
                let k = s.guesses.take().min(room);
                (k > 0).then(|| {
                    asking.push(i);
                    GuessAsk {
                        id: s.id,
                        tokens: s.tokens(),
                        k,
                    }
                })
            })
            .collect();
        if asks.is_empty() {
            return Ok(());
        }
        drafter.guess(&asks, &mut self.drafted)?;
        drop(asks);
        for (&i, guess) in asking.iter().zip(&self.drafted) {
            if !guess.is_empty() {
                self.scheduler.running_mut()[i].add_drafts(guess);
            }
        }
        Ok(())
    }

    /// Runs the step's batch and chooses a token for each chunk that wants logits: on the
    /// runner's greedy path when every such sequence takes the plain argmax and wants no
    /// log-probabilities, else sampled here from the logits, each with its own parameters and
    /// generator (log-probabilities, where asked, go to `self.logprobs`).
    fn run(&mut self, step: &ScheduledStep) -> Result<Vec<u32>> {
        let running = self.scheduler.running();
        let chunks: Vec<SeqChunk> = step
            .chunks
            .iter()
            .map(|c| {
                let seq = &running[c.seq];
                SeqChunk {
                    table: &seq.table,
                    tokens: &seq.tokens()[c.start..c.start + c.len],
                    logits: if c.logits { 1 + seq.drafts() } else { 0 },
                }
            })
            .collect();
        self.batch.fill(&chunks, false);
        // Which rows are generated tokens (a recomputed sequence's included): a sequence's
        // first `prompt().len()` tokens are its prompt.
        self.generated.clear();
        for c in &step.chunks {
            let prompt = running[c.seq].prompt().len();
            self.generated
                .extend((c.start..c.start + c.len).map(|i| i >= prompt));
        }
        self.model.set_generated(&self.generated);
        let sampled: Vec<usize> = step
            .chunks
            .iter()
            .filter(|c| c.logits)
            .map(|c| c.seq)
            .collect();
        self.logprobs.clear();
        let vocab = self.limits.vocab_size;
        self.choices.clear();
        let running = self.scheduler.running_mut();
        for &i in &sampled {
            let s = &mut running[i];
            // A row per guessed token, then the last: each chooses as the step without
            // guesses would, after the tokens before it.
            for j in 0..=s.drafts() {
                self.choices
                    .push(&s.sampling, s.prompt(), s.generated_and_drafts(j), vocab);
            }
            if let Some(c) = &mut s.constraint {
                self.choices.push_mask(c.mask());
            }
        }
        let running = self.scheduler.running();
        let logprobs_wanted = sampled.iter().any(|&i| running[i].logprobs.is_some());
        if !logprobs_wanted {
            // The device (or the CPU backend) chooses, and only the ids come back.
            return Ok(match self.choices.all_plain_greedy() {
                true => self.model.forward_greedy(&self.batch)?.to_vec(),
                false => self
                    .model
                    .forward_sample(&self.batch, &self.choices)?
                    .to_vec(),
            });
        }
        // Log-probabilities come from the raw logits: the choices are made on the host, by
        // the same functions the device runs.
        let raw = self.model.forward(&self.batch)?;
        let rows = self.choices.rows();
        self.logits.clear();
        self.logits.extend_from_slice(&raw[..rows * vocab]);
        let mut ids = Vec::with_capacity(rows);
        self.choices
            .sample_on_host(&mut self.logits, vocab, &mut ids);
        let row_seqs = sampled
            .iter()
            .flat_map(|&i| std::iter::repeat_n(i, running[i].drafts() + 1));
        for (r, i) in row_seqs.enumerate() {
            let row = &raw[r * vocab..(r + 1) * vocab];
            let lp = running[i]
                .logprobs
                .map(|k| token_logprobs(row, ids[r], k, &mut self.ranked));
            self.logprobs.push(lp);
        }
        Ok(ids)
    }

    pub fn stats(&self) -> EngineStats {
        let s = &self.scheduler;
        let b = &s.blocks;
        let prefix = b.prefix_stats();
        EngineStats {
            running: s.running().len(),
            waiting: s.waiting().count(),
            blocks_used: b.n_used(),
            blocks_free: b.n_free() - b.n_cached(),
            blocks_cached: b.n_cached(),
            prefix_lookups: prefix.lookups,
            prefix_hit_rate: prefix.hit_rate(),
            prefix_hit_tokens: prefix.hit_tokens,
            preemptions: s.preemptions(),
            prompt_tokens: self.prompt_tokens,
            generated_tokens: self.generated_tokens,
            steps: self.steps,
            drafted_tokens: self.drafted_tokens,
            accepted_tokens: self.accepted_tokens,
        }
    }

    /// The longest sequence (prompt and generated tokens but the last) a request may reach.
    pub fn max_context(&self) -> usize {
        self.limits.max_context
    }
}

/// `token`'s log-probability in `logits` (`[vocab]`, raw) and the `k` most likely tokens'.
fn token_logprobs(
    logits: &[f32],
    token: u32,
    k: usize,
    ranked: &mut Vec<(f32, u32)>,
) -> TokenLogprobs {
    // log softmax: l - (max + ln sum exp(l - max))
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits.iter().map(|&l| ((l - max) as f64).exp()).sum();
    let lse = max + sum.ln() as f32;
    let mut top = vec![];
    if k > 0 {
        ranked.clear();
        ranked.extend(logits.iter().enumerate().map(|(i, &l)| (l, i as u32)));
        let by_logit = |a: &(f32, u32), b: &(f32, u32)| b.0.total_cmp(&a.0).then(a.1.cmp(&b.1));
        let k = k.min(ranked.len());
        if k < ranked.len() {
            ranked.select_nth_unstable_by(k - 1, by_logit);
        }
        ranked[..k].sort_unstable_by(by_logit);
        top.extend(ranked[..k].iter().map(|&(l, t)| (t, l - lse)));
    }
    TokenLogprobs {
        token,
        logprob: logits[token as usize] - lse,
        top,
    }
}

#[cfg(test)]
mod tests;
