//! The step's images: the vision tower runs once for every image that this step's prefill
//! chunks reach and that has no rows yet (all of them in one batched call), then the rows of
//! the batch that are an image's tokens are marked to read the tower's rows
//! (`StepBatch::push_image_rows`). A step without image requests does nothing here.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::{panic_message, EngineLoop};
use crate::images::ImageSpan;
use crate::sequence::RequestId;

/// Buffers of the image stage, reused from step to step.
#[derive(Default)]
pub(super) struct StepImages {
    /// The images to encode this step: (request, index among its images).
    pending: Vec<(RequestId, usize)>,
    pixels: Vec<Arc<[f32]>>,
    /// The tower's output for `pending`, every image's rows end to end.
    rows: Vec<f32>,
}

/// Positions `a..b` of an image that the chunk of positions `start..start + len` computes.
fn overlap(span: ImageSpan, start: usize, len: usize) -> Option<(usize, usize)> {
    let (a, b) = (span.start.max(start), span.end.min(start + len));
    (a < b).then_some((a, b))
}

impl EngineLoop {
    /// Encodes the images the step needs and marks their rows; returns why the step failed,
    /// if the tower failed (or panicked).
    pub(super) fn place_images(&mut self) -> Option<String> {
        if self.kinds.with_images == 0 {
            return None;
        }
        if let Some(failure) = self.encode_pending() {
            return Some(failure);
        }
        let scheduled = self.scheduler.output().scheduled();
        for (i, s) in scheduled.iter().enumerate() {
            let Some(r) = self.scheduler.request_record(s.seq_id.request) else {
                continue;
            };
            let first_row = self.batch.sequences[i].query_start;
            for image in &r.images {
                let Some((a, b)) = overlap(image.span, s.start, s.len) else {
                    continue;
                };
                let rows = image
                    .rows
                    .as_ref()
                    .expect("every image a chunk reaches was encoded above");
                self.batch.push_image_rows(
                    rows,
                    first_row + a - s.start,
                    b - a,
                    a - image.span.start,
                    image.span.end,
                );
            }
        }
        None
    }

    /// Runs the tower on the images this step reaches for the first time, and keeps each
    /// one's rows with its request (its pixels are dropped then).
    fn encode_pending(&mut self) -> Option<String> {
        let buf = &mut self.images;
        buf.pending.clear();
        buf.pixels.clear();
        for s in self.scheduler.output().scheduled() {
            let request = s.seq_id.request;
            let Some(r) = self.scheduler.request_record(request) else {
                continue;
            };
            for (k, image) in r.images.iter().enumerate() {
                let reached = overlap(image.span, s.start, s.len).is_some();
                if reached && image.rows.is_none() && !buf.pending.contains(&(request, k)) {
                    buf.pending.push((request, k));
                    buf.pixels.push(
                        image
                            .pixels
                            .clone()
                            .expect("an image without rows keeps its pixels"),
                    );
                }
            }
        }
        if buf.pending.is_empty() {
            return None;
        }
        let views: Vec<&[f32]> = buf.pixels.iter().map(|p| &p[..]).collect();
        let model = &mut self.model;
        let rows = &mut buf.rows;
        match catch_unwind(AssertUnwindSafe(|| model.encode_images(&views, rows))) {
            Ok(Ok(())) => {}
            Ok(Err(e)) => return Some(format!("the vision tower failed: {e}")),
            Err(panic) => {
                return Some(format!(
                    "the vision tower panicked: {}",
                    panic_message(&panic)
                ))
            }
        }
        let per_image = buf.rows.len() / buf.pending.len();
        if per_image == 0 || per_image * buf.pending.len() != buf.rows.len() {
            return Some(format!(
                "the vision tower returned {} values for {} images",
                buf.rows.len(),
                buf.pending.len()
            ));
        }
        for (&(request, k), rows) in buf.pending.iter().zip(buf.rows.chunks(per_image)) {
            if let Some(r) = self.scheduler.request_record_mut(request) {
                let image = &mut r.images[k];
                image.rows = Some(rows.into());
                image.pixels = None;
            }
        }
        None
    }
}
