//! The safe crate against the shipped model (models/moelite-tiny-qwen3moe-Q8_0.gguf, or
//! MOELITE_TEST_MODEL): every result is checked against the library's own C paths (its
//! generation loop, a resident single-threaded run), not against this crate's output.
use std::sync::atomic::AtomicBool;
use std::sync::Arc;

use moelite::{
    Budget, ChatMessage, Context, ContextParams, GenerateParams, Model, Queue, RequestState,
    Status, StopReason,
};

mod common;
use common::{cpu, model_path};

#[test]
fn tokenize_round_trip_and_chat() {
    let model = Model::load(model_path(), &cpu(1)).unwrap();
    assert!(model.n_vocab() > 0 && model.n_layers() > 0);
    assert_eq!(model.arch(), "qwen3moe");
    let text = "Mixture-of-experts models route each token to a few experts. Ünïcödé ✓";
    let tokens = model.tokenize(text, false, false).unwrap();
    assert!(!tokens.is_empty());
    assert_eq!(model.detokenize(&tokens, false).unwrap(), text);
    // Long text: the first buffer guess is too small for neither call to fail.
    let long = text.repeat(50);
    assert_eq!(model.detokenize(&model.tokenize(&long, false, false).unwrap(), false).unwrap(), long);
    let messages = [ChatMessage::new("user", "Hello <|im_end|> there")];
    let formatted = model.chat_format(&messages, true).unwrap();
    assert!(formatted.contains("Hello <|im_end|> there"));
    // Message text stays text: the spelled control token is not the control token.
    let chat = model.chat_tokenize(&messages, true).unwrap();
    let parsed = model.tokenize(&formatted, false, true).unwrap();
    assert_ne!(chat, parsed);
}

#[test]
fn streamed_tokens_equal_the_library_generation() {
    let model = Model::load(model_path(), &cpu(2)).unwrap();
    let prompt_text = "Once upon a time";
    let params = GenerateParams::new().max_tokens(40).temperature(0.8).seed(7);
    // The library's own loop (C): text and stats.
    let mut c = Context::new(&model, &ContextParams::new().n_ctx(256)).unwrap();
    let (expected, stats) = c.generate_text(prompt_text, &params).unwrap();
    assert!(stats.generated_tokens > 0);
    // The same prompt tokens as moelite_generate's (control text parsed) through the iterator.
    let prompt = model.tokenize(prompt_text, true, true).unwrap();
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(256)).unwrap();
    let mut streamed = String::new();
    let mut ids = Vec::new();
    let mut gen = ctx.generate(&prompt, &params).unwrap();
    for t in gen.by_ref() {
        let t = t.unwrap();
        ids.push(t.id);
        streamed.push_str(&t.text);
    }
    let why = gen.stop_reason();
    drop(gen);
    assert_eq!(streamed, expected);
    assert_eq!(why, Some(stats.stop_reason));
    assert_eq!(ids.len() as i32, stats.generated_tokens);
    // As after the library's generation: the prompt and every generated token but the last.
    assert_eq!(ctx.kv_length() as usize, prompt.len() + ids.len() - 1);

    // A stop string: the output ends before it, as the library's does.
    let first_word = expected.split_whitespace().nth(2).unwrap_or("the").to_string();
    let with_stop = params.clone().stop(&first_word);
    let (expected, stats) = c.generate_text(prompt_text, &with_stop).unwrap();
    let mut gen = ctx.generate(&prompt, &with_stop).unwrap();
    let streamed: String = gen.by_ref().map(|t| t.unwrap().text).collect();
    assert_eq!(streamed, expected);
    assert_eq!(gen.stop_reason(), Some(StopReason::StopString));
    assert_eq!(stats.stop_reason, StopReason::StopString);
}

#[test]
fn errors_carry_their_status_and_message() {
    let missing = Model::load("/nonexistent/model.gguf", &cpu(1)).err().unwrap();
    assert_eq!(missing.status, Status::FILE_NOT_FOUND);
    assert!(missing.message.contains("/nonexistent/model.gguf"), "{}", missing.message);
    assert_eq!(missing.status.name(), "MOELITE_ERR_FILE_NOT_FOUND");
    let not_gguf = Model::load(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/model.rs"), &cpu(1)).err().unwrap();
    assert_eq!(not_gguf.status, Status::GGUF_BAD_MAGIC);
    let bad_threads = Model::load(model_path(), &cpu(100000)).err().unwrap();
    assert_eq!(bad_threads.status, Status::INVALID_ARGUMENT);
    let tiny_budget = Model::load(model_path(), &cpu(1).budget(Budget::Bytes(1))).err().unwrap();
    assert_eq!(tiny_budget.status, Status::BUDGET_TOO_SMALL);
    let nul = Model::load("a\0b", &cpu(1)).err().unwrap();
    assert_eq!(nul.status, Status::INVALID_ARGUMENT);

    let model = Model::load(model_path(), &cpu(1)).unwrap();
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(8)).unwrap();
    let bad = ctx.eval(&[model.n_vocab()], false).err().unwrap();
    assert_eq!(bad.status, Status::BAD_TOKEN);
    assert_eq!(ctx.kv_length(), 0, "a failed eval changed the sequence");
    let full = ctx.eval(&[1; 9], false).err().unwrap();
    assert_eq!(full.status, Status::CONTEXT_FULL);
    assert!(ctx.logits(-1).is_none());
    let bad_seq = ctx.seq_truncate(3, 0).err().unwrap();
    assert_eq!(bad_seq.status, Status::INVALID_ARGUMENT);
    let zero_ctx = Context::new(&model, &ContextParams::new().n_seq(0)).err().unwrap();
    assert_eq!(zero_ctx.status, Status::INVALID_ARGUMENT);
    assert!(Context::new(&model, &ContextParams::new()).unwrap().generate(&[], &GenerateParams::new()).is_err());

    // An abort flag set before the call stops the evaluation and leaves the sequence as it was.
    let flag = Arc::new(AtomicBool::new(true));
    ctx.set_abort_flag(Some(flag.clone())).unwrap();
    let aborted = ctx.eval(&[1, 2, 3], false).err().unwrap();
    assert_eq!(aborted.status, Status::ABORTED);
    assert_eq!(ctx.kv_length(), 0);
    ctx.set_abort_flag(None).unwrap();
    ctx.eval(&[1, 2, 3], false).unwrap();
    assert_eq!(ctx.kv_length(), 3);
}

/// Logits of `tokens` from an empty context, bitwise.
fn logits_of(model: &Model, tokens: &[i32]) -> Vec<f32> {
    let mut ctx = Context::new(model, &ContextParams::new().n_ctx(64)).unwrap();
    ctx.eval(tokens, false).unwrap();
    ctx.logits(-1).unwrap().to_vec()
}

#[test]
fn budgeted_stats_and_threads_give_the_resident_results() {
    let prompts: Vec<Vec<i32>> = (0..3).map(|s| (0..12).map(|i| 1 + (s * 131 + i * 37) % 250).collect()).collect();
    let resident = Model::load(model_path(), &cpu(1)).unwrap();
    let reference: Vec<Vec<f32>> = prompts.iter().map(|p| logits_of(&resident, p)).collect();
    assert_eq!(resident.expert_budget(), 0);

    let model = Arc::new(Model::load(model_path(), &cpu(2).budget(Budget::Fraction(0.25))).unwrap());
    assert!(model.expert_budget() > 0);
    // A quarter of the routed experts (rounded up) plus the store's reserve slot, whether given as a
    // fraction or spelled "25%" (parsed by the library, as for every tool and binding).
    let routed = (resident.n_layers() as i64 - resident.get(moelite::sys::MOELITE_MODEL_N_DENSE_LAYERS))
        * resident.get(moelite::sys::MOELITE_MODEL_N_EXPERTS);
    let expected = 1 + (0.25 * routed as f64).ceil() as i64;
    assert_eq!(model.expert_slots(), expected);
    let spelled = Model::load(model_path(), &cpu(1).budget(Budget::Text("25%".into()))).unwrap();
    assert_eq!(spelled.expert_slots(), expected);
    assert_eq!(spelled.expert_budget(), model.expert_budget());
    model.reset_expert_stats();
    // Contexts on threads of their own (Model: Send + Sync, Context: Send), bitwise the resident
    // single-threaded results.
    let handles: Vec<_> = prompts
        .iter()
        .cloned()
        .map(|p| {
            let m = Arc::clone(&model);
            std::thread::spawn(move || {
                let mut ctx = Context::new(&m, &ContextParams::new().n_ctx(64)).unwrap();
                ctx.eval(&p, false).unwrap();
                (ctx.logits(-1).unwrap().to_vec(), ctx.expert_stats(None).unwrap())
            })
        })
        .collect();
    let mut activations = 0;
    let mut bytes = 0;
    for (h, want) in handles.into_iter().zip(&reference) {
        let (got, stats) = h.join().unwrap();
        assert!(got == *want, "budgeted logits differ from the resident run");
        assert!(stats.activations > 0 && stats.misses > 0 && stats.bytes_read > 0, "{stats:?}");
        activations += stats.activations;
        bytes += stats.bytes_read;
    }
    let all = model.expert_stats(None).unwrap();
    assert_eq!(all.activations, activations, "the contexts' counters do not add up to the model's");
    // A timeline of one more evaluation: Chrome trace JSON with its reads in it.
    let trace = std::env::temp_dir().join(format!("moelite-rust-trace-{}.json", std::process::id()));
    model.trace_begin(&trace).unwrap();
    assert_eq!(model.trace_begin(&trace).err().unwrap().status, Status::INVALID_ARGUMENT);
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(64)).unwrap();
    ctx.eval(&[3, 1, 4, 1, 5, 9, 2, 6], false).unwrap();
    model.trace_end().unwrap();
    let text = std::fs::read_to_string(&trace).unwrap();
    assert!(text.starts_with("{\"traceEvents\": [") && text.contains("\"name\": \"read\""), "{}", &text[..200.min(text.len())]);
    std::fs::remove_file(&trace).unwrap();
    assert_eq!(model.trace_end().err().unwrap().status, Status::INVALID_ARGUMENT);
    assert_eq!(all.bytes_read, bytes);
    assert!(all.hit_rate() < 1.0);
    let layer0 = model.expert_stats(Some(0)).unwrap();
    assert!(layer0.activations > 0 && layer0.activations < all.activations);
    assert_eq!(model.expert_stats(Some(model.n_layers())).err().unwrap().status, Status::INVALID_ARGUMENT);
}

#[test]
fn batches_and_sessions() {
    let model = Model::load(model_path(), &cpu(2)).unwrap();
    let a: Vec<i32> = (0..6).map(|i| 5 + i * 11).collect();
    let b: Vec<i32> = (0..4).map(|i| 9 + i * 7).collect();
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(64).n_seq(2)).unwrap();
    // Interleaved: a's and b's tokens in one pass; each sequence's last logits as alone.
    let mut tokens = Vec::new();
    let mut seqs = Vec::new();
    for i in 0..6 {
        tokens.push(a[i]);
        seqs.push(0);
        if i < 4 {
            tokens.push(b[i]);
            seqs.push(1);
        }
    }
    ctx.eval_batch(&tokens, &seqs, None).unwrap();
    let last_a = tokens.len() as i32 - 1; // a's last token is the batch's last
    let last_b = 7; // b's 4th token: a0 b0 a1 b1 a2 b2 a3 b3 a4 a5
    assert!(ctx.logits(last_a).unwrap() == logits_of(&model, &a).as_slice());
    assert!(ctx.logits(last_b).unwrap() == logits_of(&model, &b).as_slice());
    assert!(ctx.logits(0).is_none());
    assert_eq!((ctx.seq_length(0), ctx.seq_length(1)), (6, 4));
    assert!(ctx.eval_batch(&tokens, &seqs[..3], None).is_err());

    // A saved session restores the caches bitwise: the next token's logits equal the
    // uninterrupted run's.
    let dir = std::env::temp_dir().join(format!("moelite-rust-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("session.bin");
    ctx.save(&path).unwrap();
    ctx.eval_batch(&[42], &[0], None).unwrap();
    let uninterrupted = ctx.logits(-1).unwrap().to_vec();
    let mut restored = Context::new(&model, &ContextParams::new().n_ctx(64).n_seq(2)).unwrap();
    restored.load(&path).unwrap();
    assert_eq!((restored.seq_length(0), restored.seq_length(1)), (6, 4));
    restored.eval_batch(&[42], &[0], None).unwrap();
    assert!(restored.logits(-1).unwrap() == uninterrupted.as_slice());
    std::fs::write(&path, b"not a session").unwrap();
    assert_eq!(restored.load(&path).err().unwrap().status, Status::BAD_SESSION);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_queue_gives_each_request_what_it_generates_alone() {
    let model = Model::load(model_path(), &cpu(2)).unwrap();
    // The reference: the library's generation loop on a context of its own for each request.
    let alone = |text: &str, params: &GenerateParams| {
        let prompt = model.tokenize(text, true, true).unwrap();
        let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(256)).unwrap();
        let mut gen = ctx.generate(&prompt, params).unwrap();
        let (mut ids, mut out) = (Vec::new(), String::new());
        for t in gen.by_ref() {
            let t = t.unwrap();
            ids.push(t.id);
            out.push_str(&t.text);
        }
        let why = gen.stop_reason().unwrap();
        (prompt, ids, out, why)
    };
    // The third request stops on a string its text alone contains part way, whatever the model says.
    let third = ("The Python standard library", GenerateParams::new().max_tokens(20).temperature(0.9).seed(5));
    let free_text: Vec<char> = alone(third.0, &third.1).2.chars().collect();
    assert!(free_text.len() > 12);
    let stop: String = free_text[free_text.len() / 2..free_text.len() / 2 + 3].iter().collect();
    let requests = [
        ("def fibonacci(n):", GenerateParams::new().max_tokens(12).temperature(0.0)),
        ("import os\n", GenerateParams::new().max_tokens(7).temperature(0.8).seed(3)),
        (third.0, third.1.stop(&stop)),
    ];
    let want: Vec<_> = requests.iter().map(|(text, params)| alone(text, params)).collect();
    assert!(want.iter().any(|w| w.3 == StopReason::StopString));
    let mut ctx = Context::new(&model, &ContextParams::new().n_ctx(256).n_seq(2).n_batch(8)).unwrap();
    let mut queue = Queue::new(&mut ctx).unwrap();
    let ids: Vec<i64> = requests.iter().zip(&want).map(|((_, p), w)| queue.add(&w.0, p).unwrap()).collect();
    assert_eq!(ids, vec![0, 1, 2]);
    assert_eq!(queue.waiting(), 3);
    let events = queue.run().unwrap();
    assert_eq!(queue.finished(), 3);
    for (id, (_, tokens, text, why)) in ids.iter().zip(&want) {
        assert_eq!(&queue.tokens(*id).unwrap(), tokens);
        assert_eq!(&queue.text(*id).unwrap(), text);
        assert_eq!(queue.state(*id).unwrap(), RequestState::Finished(*why));
        let streamed: Vec<i32> = events.iter().filter(|e| e.request == *id).filter_map(|e| e.token).collect();
        assert_eq!(&streamed, tokens);
    }
    queue.remove(0).unwrap();
    assert_eq!(queue.state(0).unwrap_err().status, Status::INVALID_ARGUMENT);
    assert_eq!(queue.add(&[1, -3], &GenerateParams::new()).unwrap_err().status, Status::BAD_TOKEN);
    let late = queue.add(&[1, 2, 3], &GenerateParams::new().max_tokens(50)).unwrap();
    queue.step().unwrap();
    assert_eq!(queue.state(late).unwrap(), RequestState::Running);
    queue.cancel(late).unwrap();
    assert_eq!(queue.state(late).unwrap(), RequestState::Finished(StopReason::Aborted));
    assert!(queue.step().unwrap().is_empty());
}
