//! Images in a class-per-folder tree (`DIR/<class>/<image>.png|jpg`), as torchvision's
//! `ImageFolder` reads them: each subfolder a class, in name order; every PNG or JPEG in it an
//! example, decoded with the `image` crate, made RGB (transparency over white) and resized to a
//! square of a given side.

use std::path::{Path, PathBuf};

use image::imageops::FilterType;

use super::DataError;
use crate::task::Data;

/// RGB images of one side, their classes and the classes' names.
#[derive(Clone, Debug, PartialEq, Default)]
pub struct ImageFolder {
    /// Width and height of every image.
    pub side: usize,
    /// Per image, `3 × side × side` values in [0, 1], channel-major (CHW), images one after
    /// another.
    pub pixels: Vec<f32>,
    pub labels: Vec<usize>,
    /// The class folders' names, a label indexing them.
    pub class_names: Vec<String>,
    /// Each image's file, relative to the tree's root (`<class>/<name>`).
    pub files: Vec<String>,
}

/// Values per image: three channels of `side × side`.
pub fn image_len(side: usize) -> usize {
    3 * side * side
}

impl ImageFolder {
    /// Read every image under `dir`'s class folders, resized to `side × side`. Files that are not
    /// PNG or JPEG (by extension) are skipped; one that cannot be decoded is an error naming it.
    pub fn read(dir: &Path, side: usize) -> Result<Self, DataError> {
        let shown = dir.display().to_string();
        let read_dir = |d: &Path| -> Result<Vec<PathBuf>, DataError> {
            let entries = std::fs::read_dir(d).map_err(|source| DataError::Read {
                file: d.display().to_string(),
                source,
            })?;
            let mut paths: Vec<PathBuf> =
                entries.filter_map(|e| e.ok().map(|e| e.path())).collect();
            paths.sort();
            Ok(paths)
        };
        let classes: Vec<PathBuf> = read_dir(dir)?.into_iter().filter(|p| p.is_dir()).collect();
        if classes.is_empty() {
            return Err(DataError::malformed(
                &shown,
                "no class folders: expected DIR/<class>/<image>.png or .jpg",
            ));
        }
        let mut out = ImageFolder {
            side,
            ..Default::default()
        };
        for (label, class) in classes.iter().enumerate() {
            let name = class
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            for file in read_dir(class)? {
                if !is_image(&file) {
                    continue;
                }
                out.push(&file, side)?;
                out.labels.push(label);
                out.files.push(format!(
                    "{name}/{}",
                    file.file_name().unwrap_or_default().to_string_lossy()
                ));
            }
            out.class_names.push(name);
        }
        if out.labels.is_empty() {
            return Err(DataError::malformed(
                &shown,
                "its class folders hold no PNG or JPEG images",
            ));
        }
        Ok(out)
    }

    /// Decode `file`, make it RGB over white, resize it and append it channel-major.
    fn push(&mut self, file: &Path, side: usize) -> Result<(), DataError> {
        let decoded = image::open(file)
            .map_err(|e| DataError::malformed(&file.display().to_string(), e.to_string()))?;
        let rgba = decoded
            .resize_exact(side as u32, side as u32, FilterType::Triangle)
            .to_rgba8();
        let start = self.pixels.len();
        self.pixels.resize(start + image_len(side), 0.0);
        let plane = side * side;
        for (i, p) in rgba.pixels().enumerate() {
            let alpha = f32::from(p[3]) / 255.0;
            for c in 0..3 {
                let value = f32::from(p[c]) / 255.0;
                self.pixels[start + c * plane + i] = value * alpha + (1.0 - alpha);
            }
        }
        Ok(())
    }

    /// Image `i`'s values (CHW).
    pub fn image(&self, i: usize) -> &[f32] {
        let n = image_len(self.side);
        &self.pixels[i * n..(i + 1) * n]
    }

    /// The images at `indices`, in that order.
    pub fn subset(&self, indices: &[usize]) -> Self {
        let mut out = ImageFolder {
            side: self.side,
            class_names: self.class_names.clone(),
            ..Default::default()
        };
        for &i in indices {
            out.pixels.extend_from_slice(self.image(i));
            out.labels.push(self.labels[i]);
            out.files.push(self.files[i].clone());
        }
        out
    }
}

fn is_image(file: &Path) -> bool {
    file.is_file()
        && file.extension().is_some_and(|e| {
            let e = e.to_ascii_lowercase();
            e == "png" || e == "jpg" || e == "jpeg"
        })
}

impl Data for ImageFolder {
    fn len(&self) -> usize {
        self.labels.len()
    }

    fn classes(&self) -> usize {
        self.class_names.len()
    }

    fn label(&self, i: usize) -> Option<usize> {
        self.labels.get(i).copied()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn write_png(path: &Path, rgba: [u8; 4]) {
        let img = image::RgbaImage::from_pixel(4, 4, image::Rgba(rgba));
        img.save(path).unwrap();
    }

    #[test]
    fn classes_are_the_folders_in_name_order_and_images_are_rgb_over_white() {
        let dir = tempfile::tempdir().unwrap();
        for (class, colour) in [("b-red", [255, 0, 0, 255]), ("a-clear", [0, 0, 0, 0])] {
            std::fs::create_dir(dir.path().join(class)).unwrap();
            write_png(&dir.path().join(class).join("x.png"), colour);
        }
        std::fs::write(dir.path().join("a-clear/notes.txt"), "not an image").unwrap();
        let f = ImageFolder::read(dir.path(), 2).unwrap();
        assert_eq!(f.class_names, vec!["a-clear", "b-red"]);
        assert_eq!(f.labels, vec![0, 1]);
        assert_eq!(f.files, vec!["a-clear/x.png", "b-red/x.png"]);
        assert_eq!(f.histogram(&[0, 1]), vec![1, 1]);
        // Transparent is white; red is red, channel-major.
        assert!(f.image(0).iter().all(|&v| (v - 1.0).abs() < 1e-6));
        assert_eq!(
            f.image(1),
            &[1.0, 1.0, 1.0, 1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]
        );
    }

    #[test]
    fn a_bad_tree_or_a_bad_image_is_an_error_naming_it() {
        let dir = tempfile::tempdir().unwrap();
        let e = ImageFolder::read(dir.path(), 8).unwrap_err().to_string();
        assert!(e.contains("no class folders"), "{e}");
        std::fs::create_dir(dir.path().join("cats")).unwrap();
        let e = ImageFolder::read(dir.path(), 8).unwrap_err().to_string();
        assert!(e.contains("hold no PNG or JPEG images"), "{e}");
        std::fs::write(dir.path().join("cats/broken.png"), b"not a png").unwrap();
        let e = ImageFolder::read(dir.path(), 8).unwrap_err().to_string();
        assert!(e.contains("cats/broken.png"), "{e}");
        let e = ImageFolder::read(&dir.path().join("missing"), 8)
            .unwrap_err()
            .to_string();
        assert!(e.contains("missing") && e.contains("cannot read"), "{e}");
    }
}
