//! The engine on its own OS thread, fed by channels.
//!
//! Commands come in on one unbounded channel (`Submit`, `Abort`); each submission brings its
//! own unbounded event channel, on which every step's output for its requests goes out. The
//! thread blocks only when it has no work; with work, it takes whatever commands have
//! arrived between two steps. It never waits on a client: a send to a request whose
//! receiver is gone (the client left) aborts that request on the spot, and its blocks go
//! back to the pool before the next step.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::mpsc::{self, Receiver, Sender};
use std::thread::JoinHandle;
use std::time::Instant;

use tokio::sync::{mpsc as tmpsc, oneshot};

use super::metrics::Metrics;
use crate::error::{Error, Result};
use crate::runner::{Forward, Limits};
use crate::serve::{Engine, FinishReason, RequestId, RequestParams, StepOutput};

/// What a request hears from the engine.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A step's output for choice `choice` of the submission.
    Output { choice: usize, out: StepOutput },
    /// The engine failed (a forward pass returned an error): the request is over.
    Failed(String),
}

/// Requests on one prompt: one per entry of `params` (the `n` choices).
pub struct Submission {
    pub prompt: Vec<u32>,
    pub params: Vec<RequestParams>,
    /// When the HTTP request arrived: time to first token counts from here.
    pub arrived: Instant,
    pub events: tmpsc::UnboundedSender<Event>,
    /// The requests' ids once queued, or why they were refused.
    pub reply: oneshot::Sender<Result<Vec<RequestId>>>,
}

pub enum Command {
    Submit(Submission),
    Abort(Vec<RequestId>),
}

/// The HTTP side's end: cheap to clone, never blocks.
#[derive(Clone)]
pub struct EngineHandle {
    commands: Sender<Command>,
    pub limits: Limits,
}

impl EngineHandle {
    /// Queues the requests; the answer comes on `reply` at the engine's next turn.
    pub fn submit(&self, s: Submission) -> Result<()> {
        self.commands
            .send(Command::Submit(s))
            .map_err(|_| Error::Usage("the engine has stopped".into()))
    }

    /// Ends requests at the next step (those already finished are ignored).
    pub fn abort(&self, ids: Vec<RequestId>) {
        if !ids.is_empty() {
            let _ = self.commands.send(Command::Abort(ids));
        }
    }
}

/// Starts the engine thread: `build` makes the engine there (a GPU runner's CUDA state
/// stays on the thread that made it) and may hand something back (`T`, say the tokenizer).
/// The thread runs until every `EngineHandle` is dropped and its work is done.
pub fn spawn<M, T, F>(build: F, metrics: Arc<Metrics>) -> Result<(EngineHandle, T, JoinHandle<()>)>
where
    M: Forward + 'static,
    T: Send + 'static,
    F: FnOnce() -> Result<(Engine<M>, T)> + Send + 'static,
{
    let (tx, rx) = mpsc::channel();
    let (ready_tx, ready) = mpsc::channel();
    let thread = std::thread::Builder::new()
        .name("rustle-engine".into())
        .spawn(move || match build() {
            Ok((engine, extra)) => {
                let _ = ready_tx.send(Ok((engine.limits(), extra)));
                EngineLoop::new(engine, metrics).run(rx)
            }
            Err(e) => {
                let _ = ready_tx.send(Err(e));
            }
        })
        .map_err(|e| Error::Usage(format!("cannot start the engine thread: {e}")))?;
    let (limits, extra) = ready
        .recv()
        .map_err(|_| Error::Usage("the engine thread died while starting".into()))??;
    let handle = EngineHandle {
        commands: tx,
        limits,
    };
    Ok((handle, extra, thread))
}

/// One request the loop is serving.
struct Live {
    choice: usize,
    events: tmpsc::UnboundedSender<Event>,
    arrived: Instant,
    last_token: Option<Instant>,
}

pub struct EngineLoop<M: Forward> {
    engine: Engine<M>,
    metrics: Arc<Metrics>,
    live: HashMap<RequestId, Live>,
}

impl<M: Forward> EngineLoop<M> {
    pub fn new(engine: Engine<M>, metrics: Arc<Metrics>) -> EngineLoop<M> {
        metrics.publish(engine.stats());
        EngineLoop {
            engine,
            metrics,
            live: HashMap::new(),
        }
    }

    pub fn engine(&self) -> &Engine<M> {
        &self.engine
    }

    pub fn run(mut self, commands: Receiver<Command>) {
        loop {
            if !self.engine.has_work() {
                // Idle: sleep until a command comes; with no sender left, shut down.
                match commands.recv() {
                    Ok(c) => self.handle(c),
                    Err(_) => return,
                }
            }
            // Whatever else arrived, then a step: new requests join the next batch.
            while let Ok(c) = commands.try_recv() {
                self.handle(c);
            }
            self.step();
        }
    }

    pub fn handle(&mut self, command: Command) {
        match command {
            Command::Submit(s) => {
                let n = s.params.len();
                let ids = self.engine.add_group(s.prompt, s.params);
                if let Ok(ids) = &ids {
                    for (choice, &id) in ids.iter().enumerate() {
                        let live = Live {
                            choice,
                            events: s.events.clone(),
                            arrived: s.arrived,
                            last_token: None,
                        };
                        self.live.insert(id, live);
                    }
                    debug_assert_eq!(ids.len(), n);
                }
                if let Err(Ok(ids)) = s.reply.send(ids) {
                    // The client left before hearing back.
                    self.abort(&ids);
                }
            }
            Command::Abort(ids) => self.abort(&ids),
        }
        self.metrics.publish(self.engine.stats());
    }

    fn abort(&mut self, ids: &[RequestId]) {
        for id in ids {
            if self.live.remove(id).is_some() && self.engine.abort(*id) {
                self.metrics.finished(FinishReason::Abort);
            }
        }
    }

    /// One engine step (when there is work), its outputs sent to their requests.
    pub fn step(&mut self) {
        if !self.engine.has_work() {
            return;
        }
        match self.engine.step() {
            Ok(outputs) => {
                let now = Instant::now();
                for out in outputs {
                    self.deliver(out, now);
                }
            }
            Err(e) => {
                // Every request in flight is lost; the engine itself stays usable.
                let message = format!("the engine failed: {e}");
                for (id, live) in self.live.drain() {
                    let _ = live.events.send(Event::Failed(message.clone()));
                    self.engine.abort(id);
                    self.metrics.finished(FinishReason::Abort);
                }
            }
        }
        self.metrics.publish(self.engine.stats());
    }

    fn deliver(&mut self, out: StepOutput, now: Instant) {
        let id = out.id;
        let Some(live) = self.live.get_mut(&id) else {
            return;
        };
        match live.last_token.replace(now) {
            None => self.metrics.first_token(now - live.arrived),
            Some(before) => self.metrics.next_token(now - before),
        }
        let finish = out.finish;
        let event = Event::Output {
            choice: live.choice,
            out,
        };
        if live.events.send(event).is_err() {
            // Nobody listens any more: stop spending steps on it.
            self.live.remove(&id);
            if finish.is_none() && self.engine.abort(id) {
                self.metrics.finished(FinishReason::Abort);
            }
            if let Some(why) = finish {
                self.metrics.finished(why);
            }
            return;
        }
        if let Some(why) = finish {
            self.live.remove(&id);
            self.metrics.finished(why);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::serve::EngineOptions;
    use crate::serve::fake::FakeModel;

    fn engine() -> Engine<FakeModel> {
        let model = FakeModel::new(40, 256, 32, 64);
        let opts = EngineOptions {
            token_budget: 64,
            eos: vec![0],
            ..Default::default()
        };
        Engine::new(model, opts).unwrap()
    }

    fn engine_loop() -> EngineLoop<FakeModel> {
        EngineLoop::new(engine(), Arc::new(Metrics::new("fake")))
    }

    fn params(max_tokens: usize) -> RequestParams {
        RequestParams {
            max_tokens,
            ignore_eos: true,
            ..Default::default()
        }
    }

    /// Submits through the command path; returns the event receiver and the ids.
    fn submit(
        l: &mut EngineLoop<FakeModel>,
        prompt: Vec<u32>,
        params: Vec<RequestParams>,
    ) -> (tmpsc::UnboundedReceiver<Event>, Result<Vec<RequestId>>) {
        let (events, rx) = tmpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        l.handle(Command::Submit(Submission {
            prompt,
            params,
            arrived: Instant::now(),
            events,
            reply,
        }));
        (rx, answer.blocking_recv().unwrap())
    }

    fn tokens(rx: &mut tmpsc::UnboundedReceiver<Event>) -> Vec<(usize, Option<u32>, bool)> {
        let mut got = vec![];
        while let Ok(Event::Output { choice, out }) = rx.try_recv() {
            got.push((choice, out.token, out.finish.is_some()));
        }
        got
    }

    #[test]
    fn outputs_reach_their_requests_with_the_choice_index() {
        let mut l = engine_loop();
        let (mut a, ids) = submit(&mut l, (1..30).collect(), vec![params(4); 2]);
        assert_eq!(ids.unwrap().len(), 2);
        let (mut b, _) = submit(&mut l, vec![5, 6, 7], vec![params(3)]);
        while l.engine().has_work() {
            l.step();
        }
        let a = tokens(&mut a);
        assert_eq!(a.iter().filter(|t| t.0 == 0).count(), 4);
        assert_eq!(a.iter().filter(|t| t.0 == 1 && t.2).count(), 1);
        assert_eq!(tokens(&mut b).len(), 3);
        let m = l.metrics.render();
        assert!(
            m.contains("rustle_time_to_first_token_seconds_count 3"),
            "{m}"
        );
        assert!(l.live.is_empty());
    }

    #[test]
    fn a_bad_request_is_refused_and_disturbs_no_one() {
        let mut l = engine_loop();
        let (mut good, _) = submit(&mut l, vec![5, 6, 7], vec![params(5)]);
        l.step();
        let (_, refused) = submit(&mut l, vec![99], vec![params(5)]);
        assert!(
            matches!(refused, Err(Error::InvalidRequest(_))),
            "{refused:?}"
        );
        while l.engine().has_work() {
            l.step();
        }
        assert_eq!(tokens(&mut good).len(), 5);
    }

    #[test]
    fn a_client_that_leaves_is_aborted_at_the_next_step_and_its_blocks_return() {
        let mut l = engine_loop();
        let (stays, _) = submit(&mut l, (1..40).collect(), vec![params(50)]);
        let (leaves, _) = submit(
            &mut l,
            (0..58).map(|i| 1 + i % 30).collect(),
            vec![params(50)],
        );
        l.step();
        l.step();
        assert_eq!(l.engine().stats().running, 2);
        drop(leaves);
        l.step();
        let s = l.engine().stats();
        assert_eq!(s.running, 1, "aborted when its event could not be sent");
        // Explicit abort (a stop string matched, a guard dropped) frees the rest.
        let id = *l.live.keys().next().unwrap();
        l.handle(Command::Abort(vec![id]));
        let s = l.metrics.stats();
        assert_eq!((s.running, s.waiting, s.blocks_used), (0, 0, 0));
        assert!(!l.engine().has_work());
        drop(stays);
        assert!(l.metrics.render().contains("finish_reason=\"abort\"} 2"));
    }

    #[test]
    fn the_thread_serves_and_shuts_down_when_the_handles_are_gone() {
        let metrics = Arc::new(Metrics::new("fake"));
        // Built on the engine thread, as `rustle serve` builds its engine.
        let (handle, (), thread) = spawn(move || Ok((engine(), ())), metrics.clone()).unwrap();
        let (events, mut rx) = tmpsc::unbounded_channel();
        let (reply, answer) = oneshot::channel();
        handle
            .submit(Submission {
                prompt: vec![3, 4, 5],
                params: vec![params(6)],
                arrived: Instant::now(),
                events,
                reply,
            })
            .unwrap();
        let [id] = answer.blocking_recv().unwrap().unwrap()[..] else {
            panic!("one id")
        };
        let mut n = 0;
        while let Some(Event::Output { out, .. }) = rx.blocking_recv() {
            assert_eq!(out.id, id);
            n += 1;
        }
        assert_eq!(n, 6, "the channel closes after the last output");
        drop(handle);
        thread.join().unwrap();
        assert_eq!(metrics.stats().generated_tokens, 6);
    }
}
