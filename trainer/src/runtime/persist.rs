//! What a member keeps on disk: its checkpoints (written, and resumed from on start) and the
//! final model.

use std::path::Path;

use burn::module::Module;
use burn::record::{FullPrecisionSettings, NamedMpkFileRecorder, Recorder};
use burn::tensor::backend::AutodiffBackend;

use super::{Checkpoint, CheckpointMeta, RunError, Trainer, newest_valid};
use crate::algorithms::{MemberError, Outer};
use crate::model::Layout;
use crate::task::Task;

impl<B: AutodiffBackend, T: Task> Trainer<B, T> {
    pub(super) fn checkpoint(&self) -> Result<(), RunError> {
        let Some(dir) = &self.env.checkpoint_dir else {
            return Ok(());
        };
        let (model, optimizer) = self.member.records()?;
        let outer = self
            .member
            .outer_state()
            .map(|o| {
                o.anchor
                    .iter()
                    .chain(&o.momentum)
                    .flat_map(|v| v.to_le_bytes())
                    .collect()
            })
            .unwrap_or_default();
        let path = Checkpoint {
            meta: CheckpointMeta {
                job: self.job_key(),
                member_id: self.env.member_id,
                step: self.step,
                topology_version: self.topology_version(),
                layout_fingerprint: self.member.layout().fingerprint(),
            },
            model,
            optimizer,
            outer,
        }
        .save(dir)?;
        tracing::info!(step = self.step, file = %path.display(), "checkpoint written");
        Ok(())
    }

    pub(super) fn restore_checkpoint(&mut self) -> Result<(), RunError> {
        let Some(dir) = self.env.checkpoint_dir.clone() else {
            return Ok(());
        };
        let (best, skipped) =
            newest_valid(&dir, &self.job_key(), self.member.layout().fingerprint());
        for e in skipped {
            tracing::warn!(error = %e, "skipping a checkpoint");
        }
        if let Some((path, c)) = best {
            let outer = outer_part(&c.outer, self.member.layout().len());
            match outer.and_then(|outer| {
                self.member.restore(c.model, c.optimizer)?;
                // A checkpoint without outer state restarts the anchor at its parameters.
                outer.map_or(Ok(()), |o| self.member.set_outer_state(o))
            }) {
                Ok(()) => {
                    self.step = c.meta.step;
                    let outer = !c.outer.is_empty();
                    tracing::info!(step = self.step, outer, file = %path.display(), "resumed from checkpoint");
                }
                Err(e) => {
                    tracing::warn!(error = %e, file = %path.display(), "skipping a checkpoint")
                }
            }
        }
        Ok(())
    }

    /// The lowest member of the topology writes the final model.
    pub(super) fn write_final_model(&mut self) -> Result<(), RunError> {
        let Some(dir) = self.env.model_dir().map(Path::to_path_buf) else {
            return Ok(());
        };
        if !self.followed.as_ref().is_some_and(|f| f.view.writes_model) {
            return Ok(());
        }
        let parameters = self.member.final_parameters();
        write_model(self.member.model(), self.member.layout(), &parameters, &dir)?;
        tracing::info!(dir = %dir.display(), "final model written (model.mpk, model.safetensors)");
        Ok(())
    }
}

/// Write the model as a burn record (`model.mpk`) and as safetensors (`model.safetensors`).
pub fn write_model<B: AutodiffBackend, M: Module<B>>(
    model: &M,
    layout: &Layout,
    parameters: &[f32],
    dir: &Path,
) -> Result<(), RunError> {
    let fail = |file: &Path, message: String| RunError::FinalModel {
        file: file.display().to_string(),
        message,
    };
    std::fs::create_dir_all(dir).map_err(|e| fail(dir, e.to_string()))?;
    let record_path = dir.join("model");
    Recorder::<B>::record(
        &NamedMpkFileRecorder::<FullPrecisionSettings>::new(),
        model.clone().into_record(),
        record_path.clone(),
    )
    .map_err(|e| fail(&record_path.with_extension("mpk"), e.to_string()))?;
    let bytes: Vec<Vec<u8>> = layout
        .slots
        .iter()
        .map(|slot| {
            parameters[slot.offset..slot.offset + slot.len()]
                .iter()
                .flat_map(|v| v.to_le_bytes())
                .collect()
        })
        .collect();
    let tensors: Vec<(String, safetensors::tensor::TensorView<'_>)> = layout
        .slots
        .iter()
        .zip(&bytes)
        .map(|(slot, data)| {
            safetensors::tensor::TensorView::new(safetensors::Dtype::F32, slot.shape.clone(), data)
                .map(|view| (slot.path.clone(), view))
        })
        .collect::<Result<_, _>>()
        .map_err(|e| fail(&dir.join("model.safetensors"), e.to_string()))?;
    let path = dir.join("model.safetensors");
    safetensors::tensor::serialize_to_file(tensors, None, &path)
        .map_err(|e| fail(&path, e.to_string()))?;
    Ok(())
}

/// A checkpoint's outer part as the anchor and momentum of a model of `values` parameters:
/// None when it has none; an error when it is not two model lengths of f32s.
fn outer_part(bytes: &[u8], values: usize) -> Result<Option<Outer>, MemberError> {
    if bytes.is_empty() {
        return Ok(None);
    }
    if bytes.len() != 8 * values {
        return Err(MemberError::Record {
            what: "outer state",
            message: format!(
                "{} bytes, where a model of {values} parameters takes {}",
                bytes.len(),
                8 * values
            ),
        });
    }
    let floats: Vec<f32> = bytes
        .chunks_exact(4)
        .map(|b| f32::from_le_bytes(b.try_into().expect("4 bytes")))
        .collect();
    let (anchor, momentum) = floats.split_at(values);
    Ok(Some(Outer {
        anchor: anchor.to_vec(),
        momentum: momentum.to_vec(),
    }))
}
