"""Process exit and object lifetimes: each scenario runs as its own Python process (the binding
and library under test, the shipped tiny model) with a timeout. A scenario passes when the
process exits by itself with the expected status -- never by a signal (segfault, abort) and never
by hanging -- and prints the expected lines. No "Fatal Python error", "FATAL" or
"Exception ignored" may appear on stderr.

Environment: MOELITE_LIBRARY (the libmoelite to test; the scenarios load the same one as this
process),
MOELITE_EXIT_TEST_MODEL (optional; default models/moelite-tiny-qwen3moe-Q8_0.gguf).
"""
import os
import signal
import subprocess
import sys
import textwrap

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
PKG_DIR = os.path.normpath(os.path.join(HERE, os.pardir))
REPO = os.path.normpath(os.path.join(PKG_DIR, os.pardir, os.pardir))
sys.path.insert(0, PKG_DIR)

import moelite  # noqa: E402

MODEL = os.environ.get("MOELITE_EXIT_TEST_MODEL") or os.path.join(REPO, "models", "moelite-tiny-qwen3moe-Q8_0.gguf")
TIMEOUT = 60

PRELUDE = """\
import gc, os, signal, sys, threading, time
import moelite
MODEL = sys.argv[1]
PROMPT = "Once upon a time"
"""


def run_script(tmp_path, body, prelude=PRELUDE):
    script = tmp_path / "scenario.py"
    script.write_text(prelude + textwrap.dedent(body))
    env = dict(os.environ)
    env["PYTHONPATH"] = PKG_DIR + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    lib = moelite.library_path  # the library this process loaded (MOELITE_LIBRARY or found)
    env["MOELITE_LIBRARY"] = os.path.abspath(lib) if os.sep in lib else lib
    env["PYTHONFAULTHANDLER"] = "1"  # a crash prints where it happened
    env.pop("PYTHONWARNINGS", None)
    try:
        p = subprocess.run([sys.executable, str(script), MODEL], env=env, cwd=str(tmp_path),
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail("the process hung (killed after %d s); stdout:\n%s\nstderr:\n%s"
                    % (TIMEOUT, (e.stdout or b"").decode(errors="replace"),
                       (e.stderr or b"").decode(errors="replace")))
    out, err = p.stdout.decode(errors="replace"), p.stderr.decode(errors="replace")
    if p.returncode < 0:
        pytest.fail("the process was killed by signal %s; stdout:\n%s\nstderr:\n%s"
                    % (signal.Signals(-p.returncode).name, out, err))
    return p.returncode, out, err


def check(tmp_path, body, lines, rc=0, err_last=None, prelude=PRELUDE):
    code, out, err = run_script(tmp_path, body, prelude)
    detail = "rc=%d\nstdout:\n%s\nstderr:\n%s" % (code, out, err)
    assert code == rc, detail
    assert out.splitlines() == lines, detail
    for bad in ("Fatal Python error", "FATAL", "Exception ignored", "Segmentation fault"):
        assert bad not in err, detail
    if err_last is not None:
        assert err.strip().splitlines()[-1].startswith(err_last), detail
    elif rc == 0:
        assert err.strip() == "", detail


def test_model_file_present():
    assert os.path.isfile(MODEL), MODEL


# ---- a context left alive by an uncaught error --------------------------------------------------

def test_aborted_eval_uncaught_at_module_level(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=64, abort=lambda: True)
        print("start", flush=True)
        ctx.eval([1, 2, 3])
        print("not reached")
    """, ["start"], rc=1, err_last="moelite.MoeliteError: MOELITE_ERR_ABORTED")


def test_aborted_eval_uncaught_context_in_cycle(tmp_path):
    # The frame, the context and its abort closure form a cycle collected at shutdown, where
    # finalizers run in no particular order (the model's may run before the context's).
    check(tmp_path, """
        def main():
            m = moelite.Model(MODEL, threads=2)
            box = {}
            ctx = moelite.Context(m, n_ctx=64, abort=lambda: box.get("stop", True))
            box["ctx"], box["model"] = ctx, m
            print("start", flush=True)
            ctx.eval([1, 2, 3])
        main()
    """, ["start"], rc=1, err_last="moelite.MoeliteError: MOELITE_ERR_ABORTED")


def test_model_finalized_before_its_context(tmp_path):
    # What a garbage cycle may do: the model's finalizer runs while its context is still in
    # use. The context must keep working (the library holds the model for it).
    check(tmp_path, """
        import numpy as np
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=64)
        ref = moelite.Context(m, n_ctx=64)
        ref.eval([1, 2, 3])
        want = ref.logits()
        ref.close()
        m.__del__()  # the model's finalizer, run first
        print("model closed:", m.closed, "context closed:", ctx.closed)
        ctx.eval([1, 2, 3])
        print("same logits:", bool(np.array_equal(ctx.logits(), want)))
        del m
        gc.collect()
        ctx.eval([4])
        print("kv", ctx.kv_length)
    """, ["model closed: True context closed: False", "same logits: True", "kv 4"])


def test_garbage_cycles_collected_in_any_order(tmp_path):
    check(tmp_path, """
        class Box: pass
        for i in range(6):
            b = Box(); b.self = b
            b.m = moelite.Model(MODEL, threads=1)
            b.ctxs = [moelite.Context(b.m, n_ctx=32) for _ in range(2)]
            for c in b.ctxs:
                c.eval([1 + i, 2])
                c.model_ref = b  # every object of the cycle reaches every other
            del b
            gc.collect()
        print("collected")
    """, ["collected"])


# ---- streaming generation left suspended -----------------------------------------------------------

def test_generator_suspended_at_exit(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=128)
        it = ctx.generate(PROMPT, max_tokens=100, temperature=0)
        print("first piece:", isinstance(next(it), str), flush=True)
        time.sleep(0.3)  # the helper thread parks, one piece ahead
        print("end")
    """, ["first piece: True", "end"])


def test_generator_suspended_in_garbage_cycle_at_exit(tmp_path):
    check(tmp_path, """
        class Box: pass
        b = Box(); b.self = b
        b.m = moelite.Model(MODEL, threads=2)
        b.ctx = moelite.Context(b.m, n_ctx=128)
        b.it = b.ctx.generate(PROMPT, max_tokens=100, temperature=0)
        next(b.it)
        del b
        print("end")
    """, ["end"])


def test_generator_consumed_by_daemon_thread_at_exit(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=256)
        started = threading.Event()
        def consume():
            for piece in ctx.generate(PROMPT, max_tokens=200, temperature=0):
                started.set()
                time.sleep(0.05)
        threading.Thread(target=consume, daemon=True).start()
        assert started.wait(30)
        print("end")
    """, ["end"])


def test_generation_evaluating_long_prompt_at_exit(tmp_path):
    # The helper thread is inside the prompt's evaluation when the main thread leaves.
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=4096)
        it = ctx.generate("the theory of everything " * 400, max_tokens=50, temperature=0)
        t = threading.Thread(target=lambda: next(it, None), daemon=True)
        t.start()
        time.sleep(0.05)
        print("end")
    """, ["end"])


def test_generator_without_atexit_hook_is_abandoned_not_joined(tmp_path):
    # Last line of defence when the atexit hook cannot run first: a finalizer during interpreter
    # finalization must neither join nor wake the parked helper thread.
    check(tmp_path, """
        import atexit
        atexit.unregister(moelite._exit_guard.at_exit)
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=128)
        it = ctx.generate(PROMPT, max_tokens=100, temperature=0)
        next(it)
        # Wait until the helper thread has queued its next piece (it then parks in the piece
        # callback): a fixed sleep alone was not enough on a loaded machine, where the thread
        # could still be evaluating -- calling the abort callback -- when finalization began.
        deadline = time.monotonic() + 20
        while ctx._active.queue.empty() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.2)
        print("end")
    """, ["end"])


def test_daemon_thread_evaluating_at_exit(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=512, abort=lambda: False)
        busy = threading.Event()
        def work():
            while True:
                try:
                    ctx.eval(list(range(1, 200)))
                except moelite.MoeliteError:
                    pass
                except RuntimeError:  # refused once the interpreter exits
                    return
                ctx.reset()
                busy.set()
        threading.Thread(target=work, daemon=True).start()
        assert busy.wait(30)
        print("end")
    """, ["end"])


def test_generation_refused_once_exiting(tmp_path):
    # An atexit handler registered before moelite's runs after it: by then no helper thread may
    # start, but the main thread may still evaluate.
    check(tmp_path, """
        import atexit
        def late():
            ctx.eval([1, 2])
            print("eval at exit ok", ctx.kv_length)
            try:
                next(ctx.generate(PROMPT, max_tokens=4))
            except RuntimeError as e:
                print("generate refused:", "exiting" in str(e))
        atexit.register(late)
        import moelite
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=64)
        print("end")
    """, ["end", "eval at exit ok 2", "generate refused: True"], prelude="import sys\nMODEL = sys.argv[1]\nPROMPT = 'Hi'\n")


# ---- exceptions inside a streaming loop ----------------------------------------------------------

def test_exception_mid_stream_uncaught(tmp_path):
    check(tmp_path, """
        def main():
            m = moelite.Model(MODEL, threads=2)
            ctx = moelite.Context(m, n_ctx=128)
            it = ctx.generate(PROMPT, max_tokens=100, temperature=0)
            for piece in it:
                print("piece", flush=True)
                raise RuntimeError("boom mid-stream")
        main()
    """, ["piece"], rc=1, err_last="RuntimeError: boom mid-stream")


def test_exception_mid_stream_caught_then_context_reused(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=128)
        try:
            for i, piece in enumerate(ctx.generate(PROMPT, max_tokens=100, temperature=0)):
                if i == 1:
                    raise ValueError("stop here")
        except ValueError as e:
            print("caught", e)
        print("stopped early:", ctx.last_stats["stop_reason_name"])
        text = "".join(ctx.generate(PROMPT, max_tokens=3, temperature=0))
        print("again:", ctx.last_stats["n_generated_tokens"] >= 1)
    """, ["caught stop here", "stopped early: aborted", "again: True"])


# ---- KeyboardInterrupt-like exceptions from callbacks ----------------------------------------------

def test_keyboard_interrupt_from_abort_callback(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        calls = []
        def abort():
            calls.append(1)
            if len(calls) == 2:
                raise KeyboardInterrupt
            return False
        ctx = moelite.Context(m, n_ctx=64, abort=abort)
        try:
            ctx.eval([1, 2, 3])
        except KeyboardInterrupt:
            print("KeyboardInterrupt; kv", ctx.kv_length)
        ctx.eval([1, 2, 3])
        print("kv", ctx.kv_length)
    """, ["KeyboardInterrupt; kv 0", "kv 3"])


def test_sigint_during_eval_raises_keyboard_interrupt(tmp_path):
    # A real Ctrl-C: the signal arrives while the main thread is inside moelite_eval; Python
    # raises KeyboardInterrupt in the next callback, which aborts the evaluation.
    # Python installs its Ctrl-C handler only where SIGINT is not ignored at start, and a
    # non-interactive shell's background job (`cmd &`, nohup) starts with it ignored: install it.
    check(tmp_path, """
        signal.signal(signal.SIGINT, signal.default_int_handler)
        m = moelite.Model(MODEL, threads=2)
        sent = []
        def abort():
            if not sent:
                sent.append(1)
                os.kill(os.getpid(), signal.SIGINT)
            return False
        ctx = moelite.Context(m, n_ctx=64, abort=abort)
        try:
            ctx.eval([1, 2, 3])
            print("not interrupted")
        except KeyboardInterrupt:
            print("KeyboardInterrupt; kv", ctx.kv_length)
        ctx.eval([4])
        print("kv", ctx.kv_length)
    """, ["KeyboardInterrupt; kv 0", "kv 1"])


def test_exception_from_routing_callback_in_generate(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        seen = []
        def routing(layer, pos0, experts, weights):
            seen.append(layer)
            if len(seen) == 5:
                raise KeyboardInterrupt
        ctx = moelite.Context(m, n_ctx=128, routing=routing)
        try:
            for piece in ctx.generate(PROMPT, max_tokens=50, temperature=0):
                pass
            print("not interrupted")
        except KeyboardInterrupt:
            print("KeyboardInterrupt from the helper thread's callback")
        seen.clear()
        ctx.reset()
        ctx.eval([1, 2])
        print("routing calls", len(seen) == m.n_layers, "kv", ctx.kv_length)
    """, ["KeyboardInterrupt from the helper thread's callback", "routing calls True kv 2"])


def test_system_exit_from_progress_callback(tmp_path):
    check(tmp_path, """
        def progress(p):
            raise SystemExit(3)
        try:
            moelite.Model(MODEL, threads=2, progress=progress)
        finally:
            print("load left")
    """, ["load left"], rc=3)


# ---- odd orders ------------------------------------------------------------------------------------

def test_del_in_odd_orders(tmp_path):
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=128)
        it = ctx.generate(PROMPT, max_tokens=6, temperature=0)
        first = next(it)
        del ctx, m          # the iterator keeps its context, the context its model
        gc.collect()
        rest = list(it)
        print("pieces", 1 + len(rest) >= 1)
        del it
        gc.collect()
        m = moelite.Model(MODEL, threads=2)
        a, b = moelite.Context(m, n_ctx=32), moelite.Context(m, n_ctx=32)
        it = a.generate(PROMPT, max_tokens=50, temperature=0)
        next(it)
        m.close()           # closes a (stopping its generation) and b
        print("closed", a.closed, b.closed, list(it))
        del a
        gc.collect()
        print("end")
    """, ["pieces True", "closed True True []", "end"])


def test_models_and_contexts_alive_at_shutdown(tmp_path):
    check(tmp_path, """
        models = [moelite.Model(MODEL, threads=2) for _ in range(2)]
        contexts = [moelite.Context(mm, n_ctx=64) for mm in models for _ in range(2)]
        for c in contexts:
            c.eval([1, 2])
        gens = [contexts[0].generate(PROMPT, max_tokens=40, temperature=0)]
        next(gens[0])
        class Box: pass
        b = Box(); b.self = b; b.ctx = contexts[1]; b.model = models[1]
        del models
        vocab_only = moelite.Model(MODEL, vocab_only=True)
        print("end")
    """, ["end"])


def test_generator_with_logits_callback_suspended_at_exit(tmp_path):
    # The logits callback runs on the helper thread before every token: at exit it must answer
    # "stop" without calling user code, like the abort and piece callbacks.
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        ctx = moelite.Context(m, n_ctx=256)
        calls = []
        def mask(logits, history):
            calls.append(len(history))
            logits[:10] = float("-inf")
            return True
        it = ctx.chat([{"role": "user", "content": "hi"}], max_tokens=200, temperature=0.5,
                      logits=mask, yield_tokens=True)
        tok, text = next(it)
        print("first token ok", tok >= 10, len(calls) >= 1)
    """, ["first token ok True True"])


def test_daemon_thread_in_sampler_loop_at_exit(tmp_path):
    # A daemon thread drawing tokens with a Python logits callback and evaluating at exit.
    check(tmp_path, """
        m = moelite.Model(MODEL, threads=2)
        started = threading.Event()
        def work():
            ctx = moelite.Context(m, n_ctx=4096)
            s = moelite.Sampler(temperature=1.0, logits=lambda lg, h: started.set() or True)
            ids = m.tokenize(PROMPT, add_special=True)
            s.accept(ids)
            ctx.eval(ids)
            try:
                while True:
                    t = s.sample(ctx)
                    ctx.eval([t])
                    if ctx.kv_length > 4000:
                        ctx.reset()
                        ctx.eval(ids)
            except (RuntimeError, moelite.MoeliteError):
                pass  # refused or aborted once the interpreter exits
        threading.Thread(target=work, daemon=True).start()
        started.wait(30)
        print("sampling")
    """, ["sampling"])
