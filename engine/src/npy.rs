//! Minimal `.npy` (format 1.0) reading and writing of little-endian float32 arrays.

use std::io::Write;
use std::path::Path;

use model::error::{EngineError, Result};

/// Writes `data` as a C-order float32 array of `shape`.
pub fn write_f32(path: &Path, shape: &[usize], data: &[f32]) -> Result<()> {
    assert_eq!(shape.iter().product::<usize>(), data.len(), "npy shape/data mismatch");
    let dims: Vec<String> = shape.iter().map(|d| d.to_string()).collect();
    let shape_s = if dims.len() == 1 { format!("({},)", dims[0]) } else { format!("({})", dims.join(", ")) };
    let mut header = format!("{{'descr': '<f4', 'fortran_order': False, 'shape': {shape_s}, }}");
    // Magic (6) + version (2) + header length (2) + header, padded with spaces to 64 bytes, '\n'.
    let unpadded = 10 + header.len() + 1;
    header.push_str(&" ".repeat((64 - unpadded % 64) % 64));
    header.push('\n');
    let mut bytes = Vec::with_capacity(10 + header.len() + data.len() * 4);
    bytes.extend_from_slice(b"\x93NUMPY\x01\x00");
    bytes.extend_from_slice(&(header.len() as u16).to_le_bytes());
    bytes.extend_from_slice(header.as_bytes());
    for v in data {
        bytes.extend_from_slice(&v.to_le_bytes());
    }
    let io = |source| EngineError::Io { path: path.to_path_buf(), source };
    let mut f = std::fs::File::create(path).map_err(io)?;
    f.write_all(&bytes).map_err(io)
}

/// Reads a little-endian float32 `.npy` file: (shape, data).
pub fn read_f32(path: &Path) -> Result<(Vec<usize>, Vec<f32>)> {
    let bytes = std::fs::read(path).map_err(|source| EngineError::Io { path: path.to_path_buf(), source })?;
    let bad = |why: &str| EngineError::BadMetadata { key: path.display().to_string(), why: why.to_string() };
    if bytes.len() < 10 || &bytes[..6] != b"\x93NUMPY" {
        return Err(bad("not an .npy file"));
    }
    let (hlen, hstart) = match bytes[6] {
        1 => (u16::from_le_bytes([bytes[8], bytes[9]]) as usize, 10),
        _ => (u32::from_le_bytes([bytes[8], bytes[9], bytes[10], bytes[11]]) as usize, 12),
    };
    let header = std::str::from_utf8(bytes.get(hstart..hstart + hlen).ok_or_else(|| bad("truncated header"))?)
        .map_err(|_| bad("header not utf-8"))?;
    if !header.contains("'<f4'") || header.contains("'fortran_order': True") {
        return Err(bad("only C-order little-endian float32 is supported"));
    }
    let shape_s = header.split("'shape':").nth(1).and_then(|s| s.split(')').next()).ok_or_else(|| bad("no shape"))?;
    let shape: Vec<usize> = shape_s
        .trim_start_matches([' ', '('])
        .split(',')
        .map(|s| s.trim())
        .filter(|s| !s.is_empty())
        .map(|s| s.parse().map_err(|_| bad("bad shape")))
        .collect::<Result<_>>()?;
    let body = &bytes[hstart + hlen..];
    let n: usize = shape.iter().product();
    if body.len() != n * 4 {
        return Err(bad("data length does not match shape"));
    }
    let data = body.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect();
    Ok((shape, data))
}

#[cfg(test)]
mod tests {
    #[test]
    fn roundtrip() {
        let p = std::env::temp_dir().join(format!("strata-npy-{}.npy", std::process::id()));
        let data: Vec<f32> = (0..6).map(|i| i as f32 * 0.5).collect();
        super::write_f32(&p, &[2, 3], &data).unwrap();
        let (shape, back) = super::read_f32(&p).unwrap();
        assert_eq!(shape, vec![2, 3]);
        assert_eq!(back, data);
        let _ = std::fs::remove_file(p);
    }
}
