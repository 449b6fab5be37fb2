//! One GGUF file from memory: header, metadata, tensor directory, through the strict reader
//! (`GgufFile::from_bytes`) and the lenient checker (`gguf::inspect_bytes`, `strata gguf
//! --check`). Neither may panic; they must agree (a file opens exactly when its report is
//! clean); every accessor of an opened file stays in bounds; an opened file written back
//! with `GgufWriter` reads back the same. The tokenizer is built from every file that opens
//! (`Tokenizer::from_gguf`: vocabulary, scores, types, merges, special ids, stored chat
//! template), and one that builds encodes, decodes and renders a chat turn.
#![no_main]

use gguf::{GgufFile, GgufWriter};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let report = gguf::inspect_bytes("fuzz.gguf", data);
    let problems: Vec<String> = report.all_problems().map(|p| format!("{} {p}", p.kind())).collect();
    for f in &report.files {
        for (k, v) in &f.metadata {
            let _ = (k.len(), v.to_string(), v.type_name());
        }
        for t in &f.tensors {
            let _ = (t.type_name(), f.file_offset(t));
        }
        let _ = (f.metadata_complete(), f.tensors_complete(), f.tensor_bytes());
    }
    let _ = report.tensors().count();

    match GgufFile::from_bytes("fuzz.gguf", data.to_vec()) {
        Err(e) => {
            let _ = (e.to_string(), e.kind(), e.path());
            assert!(!problems.is_empty(), "reader refused ({e}) what inspect found clean");
        }
        Ok(g) => {
            assert!(problems.is_empty(), "reader opened a file inspect flagged: {problems:?}");
            let _ = (g.version(), g.alignment(), g.data_offset(0), g.data_offset(1), g.paths());
            for (k, v) in g.metadata() {
                assert!(g.get(k).is_some());
                let _ = (g.get_u32(k), g.get_u64(k), g.get_i64(k), g.get_f32(k), g.get_bool(k));
                let _ = (g.get_str(k), g.get_array(k).map(<[_]>::len), v.as_int());
            }
            let _ = g.architecture();
            if let Ok(t) = tokenizer::Tokenizer::from_gguf(&g) {
                let ids = t.encode("Hello world! <|im_start|>user\n12345 <0x0A>", true, true);
                assert!(ids.iter().all(|&i| (i as usize) < t.vocab_size()));
                let _ = t.decode(&ids);
                let turn = [tokenizer::ChatMessage::new("user", "Hi")];
                let _ = t.apply_chat_template(&turn, true);
            }
            let mut w = GgufWriter::new();
            for (k, v) in g.metadata() {
                w.add_metadata(k.clone(), v.clone());
            }
            for t in g.tensors() {
                assert_eq!(g.tensor(&t.name), Some(t));
                let d = g.tensor_data(t);
                assert_eq!(d.len(), t.n_bytes, "tensor {:?}: data slice of the wrong length", t.name);
                let _ = t.n_elements();
                w.add_tensor(t.name.clone(), &t.dims, t.ty, d.to_vec());
            }
            // The writer lays tensors out densely in file order; what it writes must read back
            // with the same metadata, tensors and bytes.
            let bytes = w.to_bytes().expect("an opened file's contents must be writable");
            let back = GgufFile::from_bytes("back.gguf", bytes).expect("the written file must open");
            assert!(
                strata_fuzz::same_metadata(back.metadata(), g.metadata()),
                "metadata changed on a write/read round trip"
            );
            assert_eq!(back.tensors().len(), g.tensors().len());
            for (a, b) in back.tensors().iter().zip(g.tensors()) {
                assert_eq!((&a.name, &a.dims, a.ty, a.n_bytes), (&b.name, &b.dims, b.ty, b.n_bytes));
                assert_eq!(back.tensor_data(a), g.tensor_data(b));
            }
        }
    }
});
