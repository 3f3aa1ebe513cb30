//! Text for next-token tasks (`training.dataset.source: text`): one UTF-8 file, or every file of
//! a directory in name order (links skipped, so no text is read twice), read as bytes (a vocabulary of 256, so any text and any
//! language fit one model). The last tenth of the text is held out for testing. An example is a
//! window of `context + 1` bytes: a model reads the first `context` and predicts each next one.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use murmur_core::api::DatasetSpec;

use super::DataError;
use crate::task::{Data, Split};

/// Byte values: the vocabulary of every text.
pub const VOCABULARY: usize = 256;

/// Share of the text held out for testing, from its end.
const TEST_SHARE: f64 = 0.1;

/// Windows of `context + 1` bytes over one text, `stride` bytes apart.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenWindows {
    tokens: Arc<[u8]>,
    context: usize,
    stride: usize,
}

impl TokenWindows {
    /// Windows over `tokens`; `context` and `stride` are at least 1.
    pub fn new(tokens: impl Into<Arc<[u8]>>, context: usize, stride: usize) -> Self {
        Self {
            tokens: tokens.into(),
            context: context.max(1),
            stride: stride.max(1),
        }
    }

    /// Bytes a model reads before predicting.
    pub fn context(&self) -> usize {
        self.context
    }

    /// Example `i`: `context + 1` bytes, the inputs and (shifted by one) the targets.
    pub fn window(&self, i: usize) -> &[u8] {
        let start = i * self.stride;
        &self.tokens[start..start + self.context + 1]
    }
}

impl Data for TokenWindows {
    fn len(&self) -> usize {
        let n = self.tokens.len();
        if n <= self.context {
            0
        } else {
            (n - self.context - 1) / self.stride + 1
        }
    }
}

/// The text `spec.path` names, split for training: windows one byte apart over the first nine
/// tenths, windows that do not overlap over the last tenth for testing, and no proxy batch
/// (text has no classes to predict). Errors name the file and what is wrong with it.
pub fn load(spec: &DatasetSpec, context: usize) -> Result<Split<TokenWindows>, DataError> {
    let path = Path::new(spec.path.as_deref().unwrap_or("."));
    let text = read(path)?;
    let shown = path.display().to_string();
    let test_len = (text.len() as f64 * TEST_SHARE) as usize;
    // Both parts must hold a window: a few times the context, or the split says nothing.
    let least = 10 * (context + 1);
    if test_len < context + 1 || text.len() < least {
        return Err(DataError::malformed(
            &shown,
            format!(
                "{} bytes of text: too little for windows of {} bytes (at least {least})",
                text.len(),
                context + 1
            ),
        ));
    }
    let (train, test) = text.split_at(text.len() - test_len);
    Ok(Split {
        train: TokenWindows::new(train, context, 1),
        proxy: TokenWindows::new(Vec::new(), context, 1),
        test: TokenWindows::new(test, context, context + 1),
    })
}

/// The bytes of `path` (a file), or of the files in it in name order (a directory; links are
/// skipped), each checked to be UTF-8.
pub fn read(path: &Path) -> Result<Vec<u8>, DataError> {
    let shown = path.display().to_string();
    let files: Vec<PathBuf> = if path.is_dir() {
        let entries = std::fs::read_dir(path).map_err(|source| DataError::Read {
            file: shown.clone(),
            source,
        })?;
        let mut files: Vec<PathBuf> = entries
            .filter_map(Result::ok)
            .filter(|e| e.file_type().is_ok_and(|t| t.is_file()))
            .map(|e| e.path())
            .collect();
        files.sort();
        if files.is_empty() {
            return Err(DataError::malformed(&shown, "holds no files"));
        }
        files
    } else {
        vec![path.to_path_buf()]
    };
    let mut text = Vec::new();
    for file in files {
        let name = file.display().to_string();
        let bytes = std::fs::read(&file).map_err(|source| DataError::Read {
            file: name.clone(),
            source,
        })?;
        if let Err(e) = std::str::from_utf8(&bytes) {
            return Err(DataError::malformed(
                &name,
                format!("not UTF-8 text (byte {})", e.valid_up_to()),
            ));
        }
        text.extend_from_slice(&bytes);
    }
    if text.is_empty() {
        return Err(DataError::malformed(&shown, "empty"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    use murmur_core::api::DatasetSource;

    use super::*;

    fn spec(path: &Path) -> DatasetSpec {
        DatasetSpec {
            source: DatasetSource::Text,
            path: Some(path.display().to_string()),
            shape: None,
        }
    }

    #[test]
    fn windows_cover_the_text_a_stride_apart() {
        let w = TokenWindows::new(b"abcdefg".to_vec(), 2, 2);
        assert_eq!(w.len(), 3);
        assert_eq!(w.window(0), b"abc");
        assert_eq!(w.window(2), b"efg");
        assert_eq!(TokenWindows::new(b"ab".to_vec(), 2, 1).len(), 0);
        assert_eq!(TokenWindows::new(b"abc".to_vec(), 2, 1).len(), 1);
    }

    #[test]
    fn a_directory_is_read_in_name_order_and_split_at_its_last_tenth() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("b.txt"), "b".repeat(500)).unwrap();
        std::fs::write(dir.path().join("a.txt"), "a".repeat(500)).unwrap();
        std::os::unix::fs::symlink(dir.path().join("a.txt"), dir.path().join("c.txt")).unwrap();
        let split = load(&spec(dir.path()), 4).unwrap();
        assert_eq!(split.train.len(), 900 - 4);
        assert_eq!(split.train.window(0), b"aaaaa");
        assert_eq!(split.test.len(), 100 / 5);
        assert_eq!(split.test.window(0), b"bbbbb");
        assert!(split.proxy.is_empty());
        assert_eq!(split.train.classes(), 0);
    }

    #[test]
    fn bad_text_is_an_error_naming_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let err = |path: &Path| load(&spec(path), 8).unwrap_err().to_string();
        let missing = dir.path().join("missing.txt");
        assert!(err(&missing).starts_with(&format!("{}: cannot read", missing.display())));
        assert_eq!(
            err(dir.path()),
            format!("{}: holds no files", dir.path().display())
        );
        let binary = dir.path().join("binary.txt");
        std::fs::write(&binary, [b'o', b'k', 0xff, 0xfe]).unwrap();
        assert_eq!(
            err(&binary),
            format!("{}: not UTF-8 text (byte 2)", binary.display())
        );
        let short = dir.path().join("short.txt");
        std::fs::write(&short, "too short").unwrap();
        assert_eq!(
            err(&short),
            format!(
                "{}: 9 bytes of text: too little for windows of 9 bytes (at least 90)",
                short.display()
            )
        );
        let empty = dir.path().join("empty.txt");
        std::fs::write(&empty, "").unwrap();
        assert_eq!(err(&empty), format!("{}: empty", empty.display()));
    }
}
