//! IDX files (plain or gzip) of unsigned bytes: examples of any shape (MNIST's 28x28 images:
//! magic 0x00000803, three dimensions with the count), labels with 0x00000801.

use std::io::Read;
use std::path::Path;

use super::{CLASSES, DataError, Dataset};

fn read_maybe_gzip(path: &Path) -> Result<Vec<u8>, DataError> {
    let file = path.display().to_string();
    let raw = std::fs::read(path).map_err(|source| DataError::Read {
        file: file.clone(),
        source,
    })?;
    if raw.starts_with(&[0x1f, 0x8b]) {
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(raw.as_slice())
            .read_to_end(&mut out)
            .map_err(|e| DataError::malformed(&file, format!("corrupt gzip: {e}")))?;
        Ok(out)
    } else {
        Ok(raw)
    }
}

fn header(bytes: &[u8], file: &str, magic: u32, dims: usize) -> Result<Vec<usize>, DataError> {
    let too_short = || {
        DataError::malformed(
            file,
            format!("{} bytes is too short for an IDX header", bytes.len()),
        )
    };
    if bytes.len() < 4 {
        return Err(too_short());
    }
    let word = |k: usize| u32::from_be_bytes(bytes[4 * k..4 * k + 4].try_into().expect("4 bytes"));
    // The magic number first: a labels file passed as images is reported as such.
    if word(0) != magic {
        return Err(DataError::malformed(
            file,
            format!("magic number {:#010x}, expected {magic:#010x}", word(0)),
        ));
    }
    if bytes.len() < 4 + 4 * dims {
        return Err(too_short());
    }
    Ok((1..=dims).map(|k| word(k) as usize).collect())
}

/// "28x28": a shape as IDX headers and errors spell it.
fn spelled(shape: &[usize]) -> String {
    shape
        .iter()
        .map(|d| d.to_string())
        .collect::<Vec<_>>()
        .join("x")
}

/// Examples of `shape` (the spec's `training.dataset.shape`), each value scaled to [0, 1].
pub fn parse_idx_images(bytes: &[u8], file: &str, shape: &[usize]) -> Result<Vec<f32>, DataError> {
    // Unsigned bytes (0x08), then the number of dimensions: the count and the example's.
    let magic = 0x0000_0800 | (shape.len() as u32 + 1);
    let dims = header(bytes, file, magic, shape.len() + 1)?;
    if dims[1..] != *shape {
        return Err(DataError::malformed(
            file,
            format!(
                "examples are {}, expected {} (training.dataset.shape)",
                spelled(&dims[1..]),
                spelled(shape)
            ),
        ));
    }
    let body = &bytes[4 * (shape.len() + 2)..];
    let expected = dims.iter().product::<usize>();
    if body.len() != expected {
        return Err(DataError::malformed(
            file,
            format!(
                "header promises {} examples ({expected} bytes), file holds {} bytes",
                dims[0],
                body.len()
            ),
        ));
    }
    Ok(body.iter().map(|&b| f32::from(b) / 255.0).collect())
}

pub fn parse_idx_labels(bytes: &[u8], file: &str) -> Result<Vec<u8>, DataError> {
    let dims = header(bytes, file, 0x0000_0801, 1)?;
    let body = &bytes[8..];
    if body.len() != dims[0] {
        return Err(DataError::malformed(
            file,
            format!(
                "header promises {} labels, file holds {}",
                dims[0],
                body.len()
            ),
        ));
    }
    if let Some(bad) = body.iter().find(|&&l| l as usize >= CLASSES) {
        return Err(DataError::malformed(
            file,
            format!("label {bad} is not a class 0-9"),
        ));
    }
    Ok(body.to_vec())
}

/// Examples of `shape` from `images` and their labels from `labels`.
pub fn load_idx_pair(images: &Path, labels: &Path, shape: &[usize]) -> Result<Dataset, DataError> {
    let (fi, fl) = (images.display().to_string(), labels.display().to_string());
    let pixels = parse_idx_images(&read_maybe_gzip(images)?, &fi, shape)?;
    let labels_v = parse_idx_labels(&read_maybe_gzip(labels)?, &fl)?;
    let image_count = pixels.len() / shape.iter().product::<usize>().max(1);
    if image_count != labels_v.len() {
        return Err(DataError::CountMismatch {
            images: fi,
            image_count,
            labels: fl,
            label_count: labels_v.len(),
        });
    }
    Ok(Dataset {
        shape: shape.to_vec(),
        pixels,
        labels: labels_v,
    })
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn images(n: u32) -> Vec<u8> {
        let mut b = vec![0, 0, 8, 3];
        for d in [n, 28, 28] {
            b.extend(d.to_be_bytes());
        }
        b.extend((0..n as usize * 784).map(|k| (k % 256) as u8));
        b
    }

    fn labels(ls: &[u8]) -> Vec<u8> {
        let mut b = vec![0, 0, 8, 1];
        b.extend((ls.len() as u32).to_be_bytes());
        b.extend(ls);
        b
    }

    #[test]
    fn reads_plain_and_gzip_pairs() {
        let dir = tempfile::tempdir().unwrap();
        let (ip, lp) = (dir.path().join("i.gz"), dir.path().join("l"));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
        gz.write_all(&images(2)).unwrap();
        std::fs::write(&ip, gz.finish().unwrap()).unwrap();
        std::fs::write(&lp, labels(&[4, 2])).unwrap();
        let d = load_idx_pair(&ip, &lp, &[28, 28]).unwrap();
        assert_eq!(d.labels, vec![4, 2]);
        assert_eq!(d.pixels.len(), 2 * 784);
        assert!((d.image(0)[255] - 1.0).abs() < 1e-6);
        std::fs::write(&lp, labels(&[4, 2, 1])).unwrap();
        assert!(matches!(
            load_idx_pair(&ip, &lp, &[28, 28]),
            Err(DataError::CountMismatch {
                image_count: 2,
                label_count: 3,
                ..
            })
        ));
    }

    #[test]
    fn malformed_files_say_what_is_wrong() {
        let mut truncated = images(3);
        truncated.truncate(1000);
        let mut wrong_side = images(1);
        wrong_side[11] = 32;
        let cases: Vec<(Vec<u8>, &str)> = vec![
            (vec![0, 0, 8], "too short"),
            (labels(&[1]), "magic number 0x00000801, expected 0x00000803"),
            (truncated, "header promises 3 examples"),
            (wrong_side, "examples are 32x28, expected 28x28"),
        ];
        for (bytes, expected) in cases {
            let err = parse_idx_images(&bytes, "x-images", &[28, 28])
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("x-images: ") && err.contains(expected),
                "{err}"
            );
        }
        let err = parse_idx_labels(&labels(&[1, 11]), "y")
            .unwrap_err()
            .to_string();
        assert!(err.contains("label 11 is not a class"), "{err}");
        let err = load_idx_pair(
            Path::new("/nonexistent/i"),
            Path::new("/nonexistent/l"),
            &[28, 28],
        )
        .unwrap_err()
        .to_string();
        assert!(err.starts_with("/nonexistent/i: cannot read"), "{err}");
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("bad.gz");
        std::fs::write(&p, [0x1f, 0x8b, 1, 2, 3]).unwrap();
        assert!(
            load_idx_pair(&p, &p, &[28, 28])
                .unwrap_err()
                .to_string()
                .contains("corrupt gzip")
        );
    }

    #[test]
    fn examples_of_any_declared_shape_are_read_and_other_shapes_refused() {
        // Two 3x2x2 examples (IDX with four dimensions: the count, then the example's).
        let mut rgb = vec![0, 0, 8, 4];
        for d in [2u32, 3, 2, 2] {
            rgb.extend(d.to_be_bytes());
        }
        rgb.extend((0..24).map(|k| k as u8 * 10));
        let values = parse_idx_images(&rgb, "rgb", &[3, 2, 2]).unwrap();
        assert_eq!(values.len(), 24);
        assert!((values[23] - 230.0 / 255.0).abs() < 1e-6);
        let err = parse_idx_images(&rgb, "rgb", &[3, 4, 1])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "rgb: examples are 3x2x2, expected 3x4x1 (training.dataset.shape)"
        );
        let err = parse_idx_images(&rgb, "rgb", &[28, 28])
            .unwrap_err()
            .to_string();
        assert_eq!(err, "rgb: magic number 0x00000804, expected 0x00000803");
    }
}
