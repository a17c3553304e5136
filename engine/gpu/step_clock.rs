//! When each forward pass ran on the GPU's own clock: a CUDA event as the pass's first work
//! (the batch's upload) enters the stream, another as its last (the argmax or draw, before
//! the ids come back), both read against one event recorded when the clock started. Two
//! passes' spans then give the time between them, in which the GPU had nothing to do: the
//! host's share of a step (scheduling, the batch, the outputs), which `rustle bench --serve`
//! reports. Off unless asked for: the events cost a few microseconds a pass.

use cudarc::driver::CudaEvent;
use cudarc::driver::sys::CUevent_flags;

use super::context::Gpu;
use crate::error::{Error, Result};

/// A pass's span on the GPU: milliseconds since the clock started, to its first and its last
/// work.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Span {
    pub start_ms: f64,
    pub end_ms: f64,
}

pub struct StepClock {
    origin: CudaEvent,
    start: CudaEvent,
    end: CudaEvent,
    /// Whether `start` was recorded since the last `read`.
    started: bool,
    last: Option<Span>,
}

impl StepClock {
    /// A clock whose zero is now, on `gpu`'s stream.
    pub fn new(gpu: &Gpu) -> Result<StepClock> {
        let event = || {
            gpu.ctx
                .new_event(Some(CUevent_flags::CU_EVENT_DEFAULT))
                .map_err(Error::driver("the step clock's events"))
        };
        let origin = event()?;
        origin
            .record(&gpu.stream)
            .map_err(Error::driver("the step clock"))?;
        Ok(StepClock {
            origin,
            start: event()?,
            end: event()?,
            started: false,
            last: None,
        })
    }

    /// Marks the pass's first work: call before its first copy or launch.
    pub fn start(&mut self, gpu: &Gpu) -> Result<()> {
        self.start
            .record(&gpu.stream)
            .map_err(Error::driver("the step clock"))?;
        self.started = true;
        Ok(())
    }

    /// Marks the pass's last work: call after its last launch, before the copy back.
    pub fn end(&self, gpu: &Gpu) -> Result<()> {
        self.end
            .record(&gpu.stream)
            .map_err(Error::driver("the step clock"))
    }

    /// The pass's span, once the stream has drained past `end` (after the copy back's sync).
    pub fn read(&mut self) -> Result<()> {
        if !std::mem::take(&mut self.started) {
            return Ok(());
        }
        let since = |e: &CudaEvent| {
            self.origin
                .elapsed_ms(e)
                .map(f64::from)
                .map_err(Error::driver("reading the step clock"))
        };
        self.last = Some(Span {
            start_ms: since(&self.start)?,
            end_ms: since(&self.end)?,
        });
        Ok(())
    }

    /// The last pass's span.
    pub fn last(&self) -> Option<Span> {
        self.last
    }
}
