//! Decode steps replayed as CUDA graphs: one launch of a whole captured step instead of
//! hundreds. A graph is captured once per batch bucket (a power of two of rows; the rows
//! past the batch are padding, `DeviceBatch::upload`), per attention split count (also a
//! power of two: the extra splits are empty, a block each and no reads) and per ending
//! (the argmax, or the logits), so a handful covers every step.

use std::collections::HashMap;

use cudarc::driver::CudaGraph;

use super::attend::{GRAPH_MAX_BATCH, SplitPlan};
use crate::batch::Batch;
use crate::error::{Error, Result};

/// A captured decode step: rows (a power of two), attention splits (their count a power of
/// two, and their length), and whether it ends in the argmax.
pub type GraphKey = (usize, SplitPlan, bool);

/// The captured decode steps.
pub struct Graphs {
    graphs: HashMap<GraphKey, CudaGraph>,
    /// Replay decode steps as graphs (on by default; `bench` measures both ways).
    pub on: bool,
}

impl Default for Graphs {
    /// None captured yet, graphs on.
    fn default() -> Graphs {
        Graphs {
            graphs: HashMap::new(),
            on: true,
        }
    }
}

impl Graphs {
    /// The bucket of rows a graph replays `batch` in: the smallest power of two that holds
    /// a decode step's rows (`decode`: `is_decode_step(batch)`), or `None` for any other
    /// batch (a prompt chunk, a mix, too many sequences) or with graphs off.
    pub fn bucket(&self, batch: &Batch, decode: bool) -> Option<usize> {
        let n = batch.tokens.len();
        (self.on && decode && n <= GRAPH_MAX_BATCH).then(|| n.next_power_of_two())
    }

    pub fn contains(&self, key: &GraphKey) -> bool {
        self.graphs.contains_key(key)
    }

    pub fn insert(&mut self, key: GraphKey, graph: CudaGraph) {
        self.graphs.insert(key, graph);
    }

    /// Replays the graph captured for `key`.
    pub fn replay(&self, key: &GraphKey) -> Result<()> {
        self.graphs[key]
            .launch()
            .map_err(Error::driver("replaying the decode graph"))
    }

    /// Drops every graph (their kernels would differ now).
    pub fn clear(&mut self) {
        self.graphs.clear();
    }
}

/// Whether `batch` is a decode step: one token of each sequence, every row wanting logits.
pub fn is_decode_step(batch: &Batch) -> bool {
    let n = batch.tokens.len();
    batch.logit_rows.len() == n
        && batch.max_blocks > 0
        && batch.block_tables.len() / batch.max_blocks == n
        && (0..n).all(|i| batch.token_seq[i] as usize == i && batch.logit_rows[i] as usize == i)
}
