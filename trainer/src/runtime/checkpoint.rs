//! Checkpoints: model and optimizer records, step and topology version, in one file written
//! atomically (temporary file, fsync, rename) and closed by a SHA-256 of everything before it.
//! A file that fails its checksum or its checks is skipped with a warning, never loaded.
//!
//! Layout: `MRMRCKPT` · format u32 · meta length u32 · meta (JSON) · model length u64 · model
//! record · optimizer length u64 · optimizer record · (format 2 only: outer length u64 · the
//! outer steps' anchor then momentum, f32 little-endian) · SHA-256 (32 bytes). A checkpoint
//! without outer state is written in format 1, which every reader takes.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

const MAGIC: &[u8; 8] = b"MRMRCKPT";
const FORMAT: u32 = 1;
/// Format 1 with the outer steps' state after the optimizer record.
const FORMAT_OUTER: u32 = 2;
/// Checkpoints kept per member: the newest, and one to fall back on if it is damaged.
const KEEP: usize = 2;

#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CheckpointMeta {
    pub job: String,
    pub member_id: u32,
    pub step: u64,
    pub topology_version: u64,
    /// The model's parameter layout fingerprint: a checkpoint of another shape is not loaded.
    pub layout_fingerprint: u64,
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Checkpoint {
    pub meta: CheckpointMeta,
    pub model: Vec<u8>,
    pub optimizer: Vec<u8>,
    /// Outer steps: the anchor and the outer momentum (f32 little-endian, one model length
    /// each); empty without outer steps.
    pub outer: Vec<u8>,
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{file}: {source}")]
    Io {
        file: String,
        source: std::io::Error,
    },
    #[error("{file}: {reason}")]
    Invalid { file: String, reason: String },
}

fn invalid(file: &Path, reason: impl Into<String>) -> CheckpointError {
    CheckpointError::Invalid {
        file: file.display().to_string(),
        reason: reason.into(),
    }
}

impl Checkpoint {
    pub fn encode(&self) -> Vec<u8> {
        let meta = serde_json::to_vec(&self.meta).expect("plain struct");
        let mut b = Vec::with_capacity(64 + meta.len() + self.model.len() + self.optimizer.len());
        b.extend_from_slice(MAGIC);
        let (format, parts) = if self.outer.is_empty() {
            (FORMAT, vec![&self.model, &self.optimizer])
        } else {
            (
                FORMAT_OUTER,
                vec![&self.model, &self.optimizer, &self.outer],
            )
        };
        b.extend_from_slice(&format.to_le_bytes());
        b.extend_from_slice(&(meta.len() as u32).to_le_bytes());
        b.extend_from_slice(&meta);
        for part in parts {
            b.extend_from_slice(&(part.len() as u64).to_le_bytes());
            b.extend_from_slice(part);
        }
        let digest = Sha256::digest(&b);
        b.extend_from_slice(&digest);
        b
    }

    pub fn decode(bytes: &[u8], file: &Path) -> Result<Checkpoint, CheckpointError> {
        if bytes.len() < MAGIC.len() + 8 + 32 || &bytes[..MAGIC.len()] != MAGIC {
            return Err(invalid(file, "not a murmur checkpoint"));
        }
        let (body, digest) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(body).as_slice() != digest {
            return Err(invalid(file, "checksum mismatch (truncated or corrupted)"));
        }
        let mut at = MAGIC.len();
        let mut take = |n: usize| -> Result<&[u8], CheckpointError> {
            let part = body
                .get(
                    at..at
                        .checked_add(n)
                        .ok_or_else(|| invalid(file, "bad length"))?,
                )
                .ok_or_else(|| invalid(file, "a length runs past the end"))?;
            at += n;
            Ok(part)
        };
        let format = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes"));
        if format != FORMAT && format != FORMAT_OUTER {
            return Err(invalid(
                file,
                format!("format {format}, expected {FORMAT} or {FORMAT_OUTER}"),
            ));
        }
        let meta_len = u32::from_le_bytes(take(4)?.try_into().expect("4 bytes")) as usize;
        let meta: CheckpointMeta = serde_json::from_slice(take(meta_len)?)
            .map_err(|e| invalid(file, format!("metadata: {e}")))?;
        let model_len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes")) as usize;
        let model = take(model_len)?.to_vec();
        let optimizer_len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes")) as usize;
        let optimizer = take(optimizer_len)?.to_vec();
        let outer = if format == FORMAT_OUTER {
            let outer_len = u64::from_le_bytes(take(8)?.try_into().expect("8 bytes")) as usize;
            take(outer_len)?.to_vec()
        } else {
            Vec::new()
        };
        if at != body.len() {
            return Err(invalid(file, "bytes after the last part"));
        }
        Ok(Checkpoint {
            meta,
            model,
            optimizer,
            outer,
        })
    }

    fn file_name(member: u32, step: u64) -> String {
        format!("member-{member}-step-{step:010}.ckpt")
    }

    /// Write atomically into `dir`, then drop this member's older checkpoints beyond [`KEEP`].
    pub fn save(&self, dir: &Path) -> Result<PathBuf, CheckpointError> {
        let io = |file: &Path| {
            let file = file.display().to_string();
            move |source| CheckpointError::Io { file, source }
        };
        fs::create_dir_all(dir).map_err(io(dir))?;
        let path = dir.join(Self::file_name(self.meta.member_id, self.meta.step));
        let tmp = dir.join(format!(
            ".{}.tmp",
            Self::file_name(self.meta.member_id, self.meta.step)
        ));
        {
            let mut f = fs::File::create(&tmp).map_err(io(&tmp))?;
            f.write_all(&self.encode()).map_err(io(&tmp))?;
            f.sync_all().map_err(io(&tmp))?;
        }
        fs::rename(&tmp, &path).map_err(io(&path))?;
        let prefix = format!("member-{}-step-", self.meta.member_id);
        let mut mine: Vec<PathBuf> = list(dir)
            .into_iter()
            .filter(|p| file_name_of(p).starts_with(&prefix))
            .collect();
        mine.sort();
        for old in mine.iter().rev().skip(KEEP) {
            let _ = fs::remove_file(old);
        }
        Ok(path)
    }
}

fn file_name_of(p: &Path) -> String {
    p.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

fn list(dir: &Path) -> Vec<PathBuf> {
    fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(|e| e.ok().map(|e| e.path()))
                .filter(|p| {
                    let name = file_name_of(p);
                    name.starts_with("member-") && name.ends_with(".ckpt")
                })
                .collect()
        })
        .unwrap_or_default()
}

/// The newest valid checkpoint of `job` with this layout in `dir` (any member's: after
/// averaging, every member's model is a good start), and a warning for each file skipped on
/// the way to it. Files are read newest first, by the step in their names, and reading stops
/// at the first valid one: a directory that every member writes to holds a few of each, and
/// a replacement reads them while its clique trains without it.
pub fn newest_valid(
    dir: &Path,
    job: &str,
    layout_fingerprint: u64,
) -> (Option<(PathBuf, Checkpoint)>, Vec<CheckpointError>) {
    let mut paths = list(dir);
    // Newest first; files of one step in name order, not the directory's (which varies).
    paths.sort_by(|a, b| step_in_name(b).cmp(&step_in_name(a)).then_with(|| a.cmp(b)));
    let mut skipped = Vec::new();
    for path in paths {
        let loaded = fs::read(&path)
            .map_err(|source| CheckpointError::Io {
                file: path.display().to_string(),
                source,
            })
            .and_then(|bytes| Checkpoint::decode(&bytes, &path))
            .and_then(|c| {
                if c.meta.job != job {
                    Err(invalid(&path, format!("belongs to job {}", c.meta.job)))
                } else if c.meta.layout_fingerprint != layout_fingerprint {
                    Err(invalid(&path, "another model shape"))
                } else {
                    Ok(c)
                }
            });
        match loaded {
            Ok(c) => return (Some((path, c)), skipped),
            Err(e) => skipped.push(e),
        }
    }
    (None, skipped)
}

/// The step a checkpoint's file name says (`member-M-step-S.ckpt`); none sorts last.
fn step_in_name(path: &Path) -> Option<u64> {
    let name = file_name_of(path);
    name.strip_suffix(".ckpt")?
        .rsplit_once("-step-")?
        .1
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn checkpoint(member: u32, step: u64) -> Checkpoint {
        Checkpoint {
            meta: CheckpointMeta {
                job: "ml/mnist".into(),
                member_id: member,
                step,
                topology_version: 3,
                layout_fingerprint: 9,
            },
            model: vec![1, 2, 3],
            optimizer: vec![4; 10],
            outer: Vec::new(),
        }
    }

    #[test]
    fn outer_state_is_written_in_format_2_and_read_back() {
        let mut c = checkpoint(1, 40);
        let plain = c.encode();
        assert_eq!(
            plain[8..12],
            FORMAT.to_le_bytes(),
            "no outer state: format 1"
        );
        c.outer = (0..16).collect();
        let bytes = c.encode();
        assert_eq!(bytes[8..12], FORMAT_OUTER.to_le_bytes());
        let file = Path::new("c.ckpt");
        assert_eq!(Checkpoint::decode(&bytes, file).unwrap(), c);
        // Format 1 read as format 2 runs past the end; format 2 read as 1 leaves bytes over.
        let relabel = |mut b: Vec<u8>, format: u32| {
            b.truncate(b.len() - 32);
            b[8..12].copy_from_slice(&format.to_le_bytes());
            let digest = Sha256::digest(&b);
            b.extend_from_slice(&digest);
            b
        };
        let e = Checkpoint::decode(&relabel(plain, FORMAT_OUTER), file).unwrap_err();
        assert!(e.to_string().contains("past the end"), "{e}");
        let e = Checkpoint::decode(&relabel(bytes, FORMAT), file).unwrap_err();
        assert!(e.to_string().contains("bytes after the last part"), "{e}");
    }

    #[test]
    fn round_trips_and_detects_any_damage() {
        let c = checkpoint(1, 40);
        let bytes = c.encode();
        let file = Path::new("c.ckpt");
        assert_eq!(Checkpoint::decode(&bytes, file).unwrap(), c);
        for i in [0, 9, 20, bytes.len() / 2, bytes.len() - 1] {
            let mut bad = bytes.clone();
            bad[i] ^= 0x40;
            assert!(Checkpoint::decode(&bad, file).is_err(), "flipped byte {i}");
        }
        for len in [0, 10, bytes.len() - 1] {
            assert!(
                Checkpoint::decode(&bytes[..len], file).is_err(),
                "cut at {len}"
            );
        }
    }

    #[test]
    fn the_newest_valid_checkpoint_wins_and_damaged_ones_are_skipped() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(0, 100).save(dir.path()).unwrap();
        checkpoint(1, 200).save(dir.path()).unwrap();
        let newest = checkpoint(1, 300).save(dir.path()).unwrap();
        // Corrupt the newest: the next one is used, with a warning naming the file.
        let mut bytes = fs::read(&newest).unwrap();
        let n = bytes.len();
        bytes[n / 2] ^= 1;
        fs::write(&newest, bytes).unwrap();
        let (best, skipped) = newest_valid(dir.path(), "ml/mnist", 9);
        assert_eq!(best.unwrap().1.meta.step, 200);
        assert_eq!(skipped.len(), 1);
        assert!(skipped[0].to_string().contains("step-0000000300"));
        // Another model shape or job is never loaded.
        let (best, skipped) = newest_valid(dir.path(), "ml/mnist", 8);
        assert!(best.is_none());
        assert_eq!(skipped.len(), 3);
        assert!(newest_valid(dir.path(), "ml/other", 9).0.is_none());
    }

    #[test]
    fn files_are_read_newest_first_whoever_wrote_them() {
        let dir = tempfile::tempdir().unwrap();
        checkpoint(3, 900).save(dir.path()).unwrap();
        checkpoint(0, 1000).save(dir.path()).unwrap();
        // An older file that does not decode is never read: the newest valid one came first.
        fs::write(dir.path().join("member-2-step-0000000010.ckpt"), b"junk").unwrap();
        let (best, skipped) = newest_valid(dir.path(), "ml/mnist", 9);
        let (path, c) = best.unwrap();
        assert_eq!((c.meta.member_id, c.meta.step), (0, 1000));
        assert!(file_name_of(&path).ends_with("0000001000.ckpt"));
        assert!(skipped.is_empty(), "{skipped:?}");
        assert_eq!(
            step_in_name(Path::new("member-1-step-0000000042.ckpt")),
            Some(42)
        );
        assert_eq!(step_in_name(Path::new("member-1.ckpt")), None);
    }

    #[test]
    fn only_the_newest_two_per_member_are_kept() {
        let dir = tempfile::tempdir().unwrap();
        for step in [10, 20, 30, 40] {
            checkpoint(2, step).save(dir.path()).unwrap();
        }
        checkpoint(3, 5).save(dir.path()).unwrap();
        let mut names: Vec<String> = list(dir.path()).iter().map(|p| file_name_of(p)).collect();
        names.sort();
        assert_eq!(
            names,
            vec![
                "member-2-step-0000000030.ckpt",
                "member-2-step-0000000040.ckpt",
                "member-3-step-0000000005.ckpt"
            ]
        );
    }
}
