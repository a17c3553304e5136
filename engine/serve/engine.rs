//! The engine loop a server drives from its own thread: requests go in (`add_request`,
//! between any two steps), each `step` runs one forward pass over what the scheduler chose
//! and returns every request's new token, `abort` ends a request at once.

use super::scheduler::{ScheduledStep, Scheduler, SchedulerConfig};
use super::sequence::{FinishReason, RequestId, Sequence, Status, StopConditions};
use crate::batch::{Batch, SeqChunk};
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
}

impl Default for EngineOptions {
    fn default() -> Self {
        EngineOptions {
            token_budget: DEFAULT_TOKEN_BUDGET,
            max_seqs: 256,
            prefix_cache: true,
            eos: vec![],
        }
    }
}

pub const DEFAULT_TOKEN_BUDGET: usize = 512;

/// What a request asks for besides its prompt.
#[derive(Clone, Debug, PartialEq)]
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
        })
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
        self.scheduler.advance(&step);

        let mut outputs = Vec::with_capacity(ids.len());
        let with_logits = step.chunks.iter().filter(|c| c.logits);
        let mut logprobs = std::mem::take(&mut self.logprobs);
        logprobs.resize(ids.len(), None);
        for ((chunk, token), logprobs) in with_logits.zip(ids).zip(logprobs.drain(..)) {
            let seq = &mut self.scheduler.running_mut()[chunk.seq];
            self.generated_tokens += 1;
            let (kept, finish) = seq.push(token);
            if let Some(reason) = finish {
                seq.status = Status::Finished(reason);
            }
            outputs.push(StepOutput {
                id: seq.id,
                token: kept.then_some(token),
                finish,
                logprobs,
            });
        }
        self.logprobs = logprobs;
        self.scheduler.retire_finished();
        Ok(outputs)
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
                    logits: c.logits,
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
        for &i in &sampled {
            let s = &running[i];
            self.choices
                .push(&s.sampling, s.prompt(), s.generated(), vocab);
        }
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
        let rows = sampled.len();
        self.logits.clear();
        self.logits.extend_from_slice(&raw[..rows * vocab]);
        let mut ids = Vec::with_capacity(rows);
        self.choices
            .sample_on_host(&mut self.logits, vocab, &mut ids);
        for (r, &i) in sampled.iter().enumerate() {
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
mod tests {
    use std::collections::HashMap;

    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::*;
    use crate::serve::fake::FakeModel;

    const VOCAB: usize = 40;
    const EOS: u32 = 0;

    fn engine(
        n_blocks: usize,
        budget: usize,
        max_seqs: usize,
        prefix_cache: bool,
    ) -> Engine<FakeModel> {
        let model = FakeModel::new(VOCAB, 256, n_blocks, budget).with_max_seqs(max_seqs);
        let opts = EngineOptions {
            token_budget: budget,
            max_seqs: 1000,
            prefix_cache,
            eos: vec![EOS],
        };
        Engine::new(model, opts).unwrap()
    }

    fn greedy(max_tokens: usize) -> RequestParams {
        RequestParams {
            max_tokens,
            ..Default::default()
        }
    }

    /// Every request's output tokens and finish reason, stepping until all are done; checks
    /// the block manager after every step.
    type Outputs = HashMap<RequestId, (Vec<u32>, Option<FinishReason>)>;

    fn collect(out: &mut Outputs, step: Vec<StepOutput>) {
        for o in step {
            let e = out.entry(o.id).or_default();
            assert!(e.1.is_none(), "request {} went on after finishing", o.id);
            e.0.extend(o.token);
            e.1 = o.finish;
        }
    }

    fn drain(e: &mut Engine<FakeModel>, out: &mut Outputs) {
        while e.has_work() {
            let step = e.step().unwrap();
            collect(out, step);
            e.scheduler.audit().unwrap();
        }
    }

    /// The request run alone, in an engine of its own with room to spare.
    fn alone(prompt: &[u32], params: &RequestParams) -> (Vec<u32>, FinishReason) {
        let mut e = engine(64, 64, 64, false);
        let id = e.add_request(prompt.to_vec(), params.clone()).unwrap();
        let mut out = Outputs::new();
        drain(&mut e, &mut out);
        let (tokens, finish) = out.remove(&id).unwrap();
        (tokens, finish.unwrap())
    }

    fn prompt(rng: &mut StdRng, len: usize) -> Vec<u32> {
        (0..len)
            .map(|_| rng.random_range(1..VOCAB as u32))
            .collect()
    }

    #[test]
    fn requests_are_checked_up_front() {
        let mut e = engine(4, 16, 8, true); // 64 tokens of pool, under the 256 of context
        let err = |e: &mut Engine<FakeModel>, p: Vec<u32>, r: RequestParams| {
            e.add_request(p, r).unwrap_err().to_string()
        };
        assert!(err(&mut e, vec![], greedy(1)).contains("no tokens"));
        assert!(err(&mut e, vec![1, 40], greedy(1)).contains("prompt token 1 is id 40"));
        assert!(err(&mut e, vec![1], greedy(0)).contains("max_tokens"));
        let hot = RequestParams {
            sampling: SamplingParams {
                top_p: 0.0,
                ..Default::default()
            },
            ..greedy(1)
        };
        assert!(err(&mut e, vec![1], hot).contains("top_p must be in (0, 1]"));
        let stop = RequestParams {
            stop_token_ids: vec![99],
            ..greedy(1)
        };
        assert!(err(&mut e, vec![1], stop).contains("stop token id 99"));
        let long = err(&mut e, vec![1; 65], greedy(1));
        assert!(
            long.contains("the KV cache (--kv-blocks) holds only 64"),
            "{long}"
        );
        let much = err(&mut e, vec![1; 60], greedy(6));
        assert!(much.contains("needs 65 positions"), "{much}");
        // 60 + 5 - 1 = 64: the last token needs no room.
        e.add_request(vec![1; 60], greedy(5)).unwrap();
        assert_eq!(e.stats().waiting, 1);
    }

    #[test]
    fn a_preempted_request_finishes_with_the_same_tokens() {
        let mut rng = StdRng::seed_from_u64(1);
        // 8 blocks; three requests that each grow to 4 blocks cannot all run at once.
        let mut e = engine(8, 32, 8, true);
        let reqs: Vec<_> = (0..3).map(|_| (prompt(&mut rng, 20), greedy(40))).collect();
        let mut ids = vec![];
        for (p, r) in &reqs {
            let mut r = r.clone();
            r.ignore_eos = true;
            ids.push(e.add_request(p.clone(), r).unwrap());
        }
        let mut out = Outputs::new();
        drain(&mut e, &mut out);
        assert!(e.stats().preemptions > 0, "the pool was meant to run out");
        for (id, (p, r)) in ids.iter().zip(&reqs) {
            let mut r = r.clone();
            r.ignore_eos = true;
            let want = alone(p, &r);
            assert_eq!(out[id], (want.0, Some(want.1)), "request {id}");
            assert_eq!(out[id].0.len(), 40);
        }
    }

    #[test]
    fn a_prefix_hit_gives_the_tokens_of_a_miss() {
        let mut rng = StdRng::seed_from_u64(2);
        let system = prompt(&mut rng, 50);
        let asks: Vec<Vec<u32>> = (0..4)
            .map(|i| [system.clone(), prompt(&mut rng, 3 + i)].concat())
            .collect();
        let mut runs = vec![];
        for cache in [false, true] {
            let mut e = engine(32, 64, 8, cache);
            let mut out = Outputs::new();
            let mut ids = vec![];
            // One after another, so each later one can find the first's blocks.
            for p in &asks {
                ids.push(e.add_request(p.clone(), greedy(12)).unwrap());
                drain(&mut e, &mut out);
            }
            let s = e.stats();
            if cache {
                // 3 full blocks of the 50-token prefix, for each of the three later requests.
                assert_eq!(s.prefix_hit_tokens, 3 * 48);
                assert!(s.prefix_hit_rate > 0.5, "{s:?}");
                assert_eq!(s.blocks_used, 0);
                assert!(s.blocks_cached > 0);
            } else {
                assert_eq!((s.prefix_hit_tokens, s.blocks_cached), (0, 0));
            }
            runs.push(ids.iter().map(|id| out[id].clone()).collect::<Vec<_>>());
        }
        assert_eq!(runs[0], runs[1]);
    }

    #[test]
    fn hash_collisions_cost_hits_never_tokens() {
        let mut rng = StdRng::seed_from_u64(3);
        let mut e = engine(40, 48, 8, true);
        e.scheduler.blocks.prefix.set_hash(|_, _| 1);
        let shared = prompt(&mut rng, 40);
        let mut reqs = vec![];
        for i in 0..8 {
            let p = if i % 2 == 0 {
                [shared.clone(), prompt(&mut rng, 5)].concat()
            } else {
                prompt(&mut rng, 45)
            };
            reqs.push((e.add_request(p.clone(), greedy(20)).unwrap(), p));
        }
        let mut out = Outputs::new();
        drain(&mut e, &mut out);
        for (id, p) in &reqs {
            let want = alone(p, &greedy(20));
            assert_eq!(out[id], (want.0, Some(want.1)));
        }
    }

    #[test]
    fn seeded_sampling_repeats_whatever_the_batch() {
        let mut rng = StdRng::seed_from_u64(4);
        let sampled = |seed| RequestParams {
            sampling: SamplingParams {
                temperature: 0.9,
                top_p: 0.95,
                presence_penalty: 0.3,
                seed,
                ..Default::default()
            },
            max_tokens: 30,
            ..Default::default()
        };
        let mine = prompt(&mut rng, 23);
        let (want, _) = alone(&mine, &sampled(7));
        let mut e = engine(64, 40, 16, true);
        let mut out = Outputs::new();
        for i in 0..10 {
            e.add_request(prompt(&mut rng, 5 + 3 * i), sampled(i as u64))
                .unwrap();
            collect(&mut out, e.step().unwrap());
        }
        let id = e.add_request(mine, sampled(7)).unwrap();
        drain(&mut e, &mut out);
        assert_eq!(out[&id].0, want);
    }

    #[test]
    fn logprobs_report_the_chosen_token_and_the_most_likely() {
        let p: Vec<u32> = (1..30).collect();
        let with = RequestParams {
            logprobs: Some(3),
            ..greedy(8)
        };
        let mut e = engine(16, 32, 8, true);
        let id = e.add_request(p.clone(), with).unwrap();
        let mut tokens = vec![];
        while e.has_work() {
            for o in e.step().unwrap() {
                assert_eq!(o.id, id);
                let lp = o.logprobs.expect("asked for");
                assert_eq!(o.token.unwrap_or(lp.token), lp.token);
                // Greedy: the chosen token is the most likely one.
                assert_eq!(lp.top.len(), 3);
                assert_eq!((lp.top[0].0, lp.top[0].1), (lp.token, lp.logprob));
                assert!(lp.top.windows(2).all(|w| w[0].1 >= w[1].1));
                let mass: f32 = lp.top.iter().map(|t| t.1.exp()).sum();
                assert!(lp.logprob < 0.0 && mass < 1.0, "{lp:?}");
                tokens.extend(o.token);
            }
        }
        let m = e.model();
        assert_eq!(
            (m.passes, m.greedy_passes),
            (8, 0),
            "the logits path, never the greedy one"
        );
        // The logits path chooses what the greedy path does.
        assert_eq!(tokens, alone(&p, &greedy(8)).0);
        // Without logprobs there are none; a sampled token has its own, below the top one.
        let sampled = RequestParams {
            sampling: SamplingParams {
                temperature: 1.5,
                seed: 3,
                ..Default::default()
            },
            logprobs: Some(0),
            ..greedy(20)
        };
        let mut e = engine(16, 32, 8, true);
        e.add_request(p.clone(), greedy(3)).unwrap();
        e.add_request(p, sampled).unwrap();
        while e.has_work() {
            for o in e.step().unwrap() {
                match o.id {
                    0 => assert!(o.logprobs.is_none()),
                    _ => assert!(o.logprobs.unwrap().top.is_empty()),
                }
            }
        }
        let too_many = RequestParams {
            logprobs: Some(MAX_TOP_LOGPROBS + 1),
            ..greedy(3)
        };
        assert!(e.add_request(vec![1, 2], too_many).is_err());
    }

    /// `n` choices of one prompt: the prompt is computed once and its full blocks are held
    /// by every choice.
    #[test]
    fn siblings_share_the_prompts_full_blocks() {
        // 40 tokens: 2 full blocks before the last
        let p: Vec<u32> = (0..40).map(|i| 1 + i % 39).collect();
        let mut e = engine(32, 64, 8, true);
        let ids = e.add_group(p.clone(), vec![greedy(6); 3]).unwrap();
        let mut out = Outputs::new();
        collect(&mut out, e.step().unwrap());
        let s = e.stats();
        assert_eq!(
            (s.running, s.waiting),
            (1, 2),
            "the first computes the prompt"
        );
        collect(&mut out, e.step().unwrap());
        let running = e.scheduler().running();
        assert_eq!(running.len(), 3);
        let shared = &running[0].table.blocks[..2];
        for seq in &running[1..] {
            assert_eq!(&seq.table.blocks[..2], shared);
            assert_ne!(seq.table.blocks[2], running[0].table.blocks[2]);
        }
        for &b in shared {
            assert_eq!(e.scheduler().blocks.refcount(b), 3);
        }
        assert_eq!(e.stats().prefix_hit_tokens, 2 * 32);
        drain(&mut e, &mut out);
        let want = alone(&p, &greedy(6));
        for id in ids {
            assert_eq!(out[&id], (want.0.clone(), Some(want.1)));
        }
        // Without the prefix cache there is nothing to wait for: all start at once.
        let mut e = engine(32, 128, 8, false);
        e.add_group(p.clone(), vec![greedy(6); 3]).unwrap();
        e.step().unwrap();
        assert_eq!(e.stats().running, 3);
        // One bad member refuses the whole group.
        let bad = RequestParams {
            max_tokens: 0,
            ..greedy(1)
        };
        assert!(e.add_group(p, vec![greedy(1), bad]).is_err());
        assert_eq!(e.stats().waiting, 0);
    }

    #[test]
    fn abort_ends_a_request_and_frees_its_blocks() {
        let mut e = engine(16, 32, 8, true);
        let a = e.add_request(vec![3; 40], greedy(50)).unwrap();
        let b = e.add_request(vec![4; 40], greedy(50)).unwrap();
        e.step().unwrap();
        e.step().unwrap();
        assert!(e.abort(a));
        assert!(!e.abort(a));
        let s = e.stats();
        assert_eq!((s.running, s.waiting), (1, 0));
        assert!(e.abort(b));
        let s = e.stats();
        assert!(!e.has_work());
        assert_eq!(s.blocks_used, 0);
        assert_eq!(s.blocks_free + s.blocks_cached, 16);
        e.scheduler.audit().unwrap();
    }

    /// Random workloads: requests of random lengths (many sharing prefixes) arrive at random
    /// steps, some sampled, some aborted, in pools small enough to force preemptions. After
    /// every step the block manager's books must balance; at the end every block is back;
    /// every request that finished produced exactly what it produces alone, and every aborted
    /// one a prefix of that.
    #[test]
    fn random_workloads_never_leak_and_never_change_a_token() {
        let (mut steps, mut preemptions, mut hits, mut aborts, mut finished) = (0, 0, 0, 0, 0);
        for seed in 0..8 {
            let mut rng = StdRng::seed_from_u64(seed);
            let n_blocks = rng.random_range(10..40);
            let budget = rng.random_range(4..80);
            let max_seqs = rng.random_range(1..12);
            let mut e = engine(n_blocks, budget, max_seqs, seed % 4 != 3);
            let room = (n_blocks * 16).min(256);
            let systems: Vec<Vec<u32>> = (0..3)
                .map(|_| {
                    let n = rng.random_range(0..60);
                    prompt(&mut rng, n)
                })
                .collect();
            let mut reqs: Vec<(RequestId, Vec<u32>, RequestParams)> = vec![];
            let mut aborted = vec![];
            let mut out = Outputs::new();
            for _ in 0..1500 {
                if reqs.len() < 120 && rng.random_bool(0.3) {
                    let sys = &systems[rng.random_range(0..systems.len())];
                    let n = rng.random_range(1..40);
                    let p = [sys.clone(), prompt(&mut rng, n)].concat();
                    let max_tokens = rng.random_range(1..40).min(room + 1 - p.len());
                    let mut r = greedy(max_tokens);
                    if rng.random_bool(0.3) {
                        r.sampling.temperature = 0.8;
                        r.sampling.seed = rng.random();
                    }
                    r.ignore_eos = rng.random_bool(0.2);
                    reqs.push((e.add_request(p.clone(), r.clone()).unwrap(), p, r));
                }
                if rng.random_bool(0.03) && !reqs.is_empty() {
                    let (id, ..) = reqs[rng.random_range(0..reqs.len())];
                    if e.abort(id) {
                        aborted.push(id);
                    }
                }
                let step = e.step().unwrap();
                collect(&mut out, step);
                e.scheduler.audit().unwrap();
                steps += 1;
            }
            drain(&mut e, &mut out);
            let s = e.stats();
            assert_eq!((s.running, s.waiting, s.blocks_used), (0, 0, 0));
            assert_eq!(s.blocks_free + s.blocks_cached, n_blocks);
            e.scheduler.blocks.audit([]).unwrap();
            for (id, p, r) in &reqs {
                let (want, why) = alone(p, r);
                let got = out.get(id).cloned().unwrap_or_default();
                if aborted.contains(id) {
                    assert!(
                        want.starts_with(&got.0),
                        "seed {seed}: aborted request {id}"
                    );
                } else {
                    assert_eq!(got, (want, Some(why)), "seed {seed}: request {id}");
                }
            }
            let m = e.model();
            assert!(m.max_tokens_seen <= budget && m.max_seqs_seen <= max_seqs);
            preemptions += s.preemptions;
            hits += s.prefix_hit_tokens;
            aborts += aborted.len();
            finished += reqs.len() - aborted.len();
        }
        eprintln!(
            "{steps} steps, {preemptions} preemptions, {hits} prefix-hit tokens, {aborts} aborts, {finished} finished"
        );
        assert!(steps >= 8 * 1500);
        assert!(
            preemptions > 0 && hits > 0 && aborts > 0,
            "{preemptions} {hits} {aborts}"
        );
    }
}
