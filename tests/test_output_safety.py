"""Nothing of the user's is lost: --overwrite replaces only a folder a build wrote, the output is
re-checked when it is published, one build at a time writes a path, a killed replacement is
recovered, SIGTERM is Ctrl-C, and what killed builds leave behind is cleaned up."""

import fcntl
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from helpers import add_example_tokenizer
from safetensors.numpy import save_file

from builder.cli import main
from builder.units import human

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "examples" / "tiny-llama"


def run(capsys, *argv):
    rc = main([str(a) for a in argv])
    return rc, capsys.readouterr().err


def snapshot(folder):
    """Every entry under `folder`, a file with its bytes: what must survive a refused build."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in sorted(folder.rglob("*"))}


def build(out, *flags):
    assert main(["-m", str(EXAMPLE), "-o", str(out), "-q", "-p", "fp32", *flags]) == 0
    return out


@pytest.fixture
def signals_as_in_a_terminal():
    """SIGINT and SIGTERM as a command typed in a terminal gets them (Python's KeyboardInterrupt,
    the default action), whatever this test run inherited. A run started in the background of a
    script (`pytest &` without job control) inherits SIGINT ignored, and builder rightly keeps an
    ignored signal ignored (test_an_ignored_signal_stays_ignored_while_publishing): the Ctrl-C
    tests then saw exit 0, as if the signal were lost. A subprocess inherits these too."""
    wanted = {signal.SIGINT: signal.default_int_handler, signal.SIGTERM: signal.SIG_DFL}
    previous = {signum: signal.signal(signum, handler) for signum, handler in wanted.items()}
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


def test_a_build_yaml_builder_did_not_write_is_not_replaced(tmp_path, capsys):
    app = tmp_path / "app"
    (app / "lib").mkdir(parents=True)
    (app / "build.yaml").write_text("targets:\n  $default:\n    builders:\n      json_serializable: {}\n")
    (app / "lib" / "main.dart").write_text("void main() {}\n")
    before = snapshot(tmp_path)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", app, "--overwrite", "-q")
    assert rc == 2 and err == (f"error: output folder {app} has a build.yaml that builder did not write; "
                               "not replacing it, even with --overwrite\n")
    assert snapshot(tmp_path) == before


def test_a_model_folder_with_a_build_record_alone_is_not_replaced(tmp_path, capsys):
    # build.yaml is a builder record, but a model.safetensors is no file a build writes.
    out = tmp_path / "out"
    shutil.copytree(build(tmp_path / "first"), out)
    (out / "model.safetensors").write_bytes(b"weights of my own")
    before = snapshot(tmp_path)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "--overwrite", "-q")
    assert rc == 2 and err == (f"error: output folder {out} holds model.safetensors, which a build does not write; "
                               "not replacing it, even with --overwrite\n")
    assert snapshot(tmp_path) == before


def test_a_previous_build_plus_a_file_of_the_user_is_not_replaced(tmp_path, capsys):
    out = build(tmp_path / "out")
    (out / "notes.txt").write_text("my benchmark results")
    (out / "runs").mkdir()
    before = snapshot(tmp_path)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "--overwrite", "-q")
    assert rc == 2 and "holds notes.txt, runs, which a build does not write" in err and len(err.splitlines()) == 1
    assert snapshot(tmp_path) == before


def test_a_previous_build_is_replaced(tmp_path, capsys):
    out = build(tmp_path / "out")
    fp32 = (out / "model.onnx.data").stat().st_size
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "--overwrite", "-q", "-p", "fp16")
    assert rc == 0, err
    assert (out / "model.onnx.data").stat().st_size < fp32  # the fp16 build's weights
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]  # no hidden staging, old or lock left


def test_a_previous_build_of_an_older_version_is_replaced(tmp_path, capsys):
    # Every build.yaml so far has had a `record:` mapping naming builder_version.
    out = tmp_path / "out"
    out.mkdir()
    (out / "build.yaml").write_text("model: x\nrecord:\n  builder_version: 0.1.0\n  sha256: {}\n")
    for name in ("model.onnx", "model.onnx.data", "vision.onnx", "vision.onnx.data", "genai_config.json",
                 "tokenizer.json", "vision_processor.json"):
        (out / name).write_text("old")
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "--overwrite", "-q", "-p", "fp32")
    assert rc == 0, err
    assert not (out / "vision.onnx").exists() and (out / "model.onnx").stat().st_size > 3


def test_a_link_loop_in_the_input_folder_does_not_stop_the_output_check(tmp_path, capsys):
    # The check that the output holds no input follows the input's links; a loop leads nowhere.
    model = tmp_path / "model"
    shutil.copytree(EXAMPLE, model)
    (model / "loop").symlink_to("loop")
    rc, err = run(capsys, "-m", model, "-o", tmp_path / "out", "-q", "-p", "fp32")
    assert rc == 0, err
    assert (tmp_path / "out" / "model.onnx").is_file()


def test_an_output_inside_a_link_loop_is_refused_in_one_line(tmp_path, capsys):
    (tmp_path / "loop").symlink_to("loop")
    rc, err = run(capsys, "-m", EXAMPLE, "-o", tmp_path / "loop" / "out", "-q", "-p", "fp32")
    assert rc == 2 and err == f"error: cannot write to {tmp_path / 'loop'}: File exists\n", err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["loop"]


def in_the_middle_of_the_build(monkeypatch, action):
    """Runs `action` once, while the weights are written, as another process could (a build that
    `action` starts writes its own weights unhindered)."""
    import builder.writer

    real = builder.writer.save_models
    pending = [action]

    def writing(*args, **kwargs):
        if pending:
            pending.pop()()
        return real(*args, **kwargs)

    monkeypatch.setattr(builder.writer, "save_models", writing)


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_folder_made_at_the_output_during_the_build_survives(tmp_path, capsys, monkeypatch, overwrite):
    out = tmp_path / "out"

    def user_makes_a_folder():
        out.mkdir()
        (out / "notes.txt").write_text("mine")

    in_the_middle_of_the_build(monkeypatch, user_makes_a_folder)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32", *overwrite)
    assert rc == 2 and len(err.splitlines()) == 1 and err.startswith(f"error: output folder {out} appeared"), err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]
    assert snapshot(out) == {"notes.txt": b"mine"}


def test_an_empty_folder_made_at_the_output_during_the_build_is_not_replaced(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    made = []

    def user_makes_an_empty_folder():
        out.mkdir()
        made.append(out.stat().st_ino)

    in_the_middle_of_the_build(monkeypatch, user_makes_an_empty_folder)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32")
    assert rc == 2 and err.startswith(f"error: output folder {out} appeared"), err
    assert out.stat().st_ino == made[0] and list(out.iterdir()) == []


def test_an_empty_output_folder_there_from_the_start_is_filled(tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32")
    assert rc == 0, err
    assert (out / "model.onnx").is_file()


def test_an_empty_output_folder_that_fills_during_the_build_is_not_replaced(tmp_path, capsys, monkeypatch):
    out = tmp_path / "out"
    out.mkdir()
    in_the_middle_of_the_build(monkeypatch, lambda: (out / "notes.txt").write_text("mine"))
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32")
    assert rc == 2 and len(err.splitlines()) == 1 and str(out) in err, err
    assert snapshot(out) == {"notes.txt": b"mine"}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.parametrize("overwrite", [[], ["--overwrite"]])
def test_a_second_build_to_the_same_output_is_refused_while_the_first_runs(tmp_path, capsys, monkeypatch, overwrite):
    out = tmp_path / "out"
    second = {}

    def second_build():
        second["rc"] = main(["-m", str(EXAMPLE), "-o", str(out), "-q", "-p", "fp16", *overwrite])
        second["err"] = capsys.readouterr().err

    in_the_middle_of_the_build(monkeypatch, second_build)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32", *overwrite)
    assert rc == 0, err
    assert second["rc"] == 2 and second["err"] == f"error: another build is writing {out}; wait for it to finish\n"
    assert "precision: fp32" in (out / "build.yaml").read_text()  # the first build's output, complete
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_a_build_into_another_folder_beside_a_running_one_proceeds(tmp_path, capsys, monkeypatch):
    other = {}
    in_the_middle_of_the_build(monkeypatch, lambda: other.update(rc=main(
        ["-m", str(EXAMPLE), "-o", str(tmp_path / "b"), "-q", "-p", "fp32"])))
    rc, err = run(capsys, "-m", EXAMPLE, "-o", tmp_path / "a", "-q", "-p", "fp32")
    assert rc == 0 and other["rc"] == 0, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a", "b"]


# A script that runs builder's main, with the kernel's atomic exchange of two folders unavailable
# (the fallback of two renames), and kills itself right after the first rename of --overwrite moved
# the previous output aside: what a power cut or SIGKILL at that moment leaves.
KILLED_BETWEEN_RENAMES = textwrap.dedent("""
    import os, signal, sys
    from pathlib import Path
    import builder.renames
    builder.renames._renameat2 = lambda source, destination, flags: False
    final = Path(os.path.realpath(sys.argv[1]))
    real_rename, real_replace = os.rename, os.replace

    def killed_when_the_output_is_gone(rename):
        def renaming(source, destination):
            if Path(os.path.realpath(source)) == final and ".old-" in str(destination):
                rename(source, destination)
                os.kill(os.getpid(), signal.SIGKILL)
            return rename(source, destination)
        return renaming

    os.rename, os.replace = killed_when_the_output_is_gone(real_rename), killed_when_the_output_is_gone(real_replace)
    from builder.cli import main
    sys.exit(main(sys.argv[2:]))
""")


def killed_between_renames(out, *argv):
    r = subprocess.run([sys.executable, "-c", KILLED_BETWEEN_RENAMES, str(out), *argv], capture_output=True,
                       text=True, cwd=out.parent, timeout=120)
    assert r.returncode == -signal.SIGKILL, r.stderr
    assert not out.exists() and list(out.parent.glob(".out.old-*"))


def test_a_kill_between_the_renames_of_overwrite_loses_no_output(tmp_path, capsys):
    out = build(tmp_path / "out")
    previous = snapshot(out)
    killed_between_renames(out, "-m", str(EXAMPLE), "-o", str(out), "-q", "-p", "fp16", "--overwrite")
    # The next build into the same folder puts the previous output back before anything else.
    rc, err = run(capsys, "-m", EXAMPLE, "-o", tmp_path / "other", "-q", "-p", "fp32")
    assert rc == 0
    assert f"warning: restored {out}: a build was killed while replacing it" in err.splitlines()
    assert snapshot(out) == previous
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other", "out"]


def test_a_kill_between_the_renames_then_a_rebuild_replaces_the_previous_output(tmp_path, capsys):
    out = build(tmp_path / "out")
    killed_between_renames(out, "-m", str(EXAMPLE), "-o", str(out), "-q", "-p", "fp16", "--overwrite")
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp16", "--overwrite")
    assert rc == 0, err
    assert "precision: fp16" in (out / "build.yaml").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_without_the_kernel_exchange_overwrite_still_replaces(tmp_path, capsys, monkeypatch):
    import builder.renames

    monkeypatch.setattr(builder.renames, "_renameat2", lambda source, destination, flags: False)
    out = build(tmp_path / "out")
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp16", "--overwrite")
    assert rc == 0, err
    assert "precision: fp16" in (out / "build.yaml").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.fixture(scope="module")
def slow_checkpoint(tmp_path_factory):
    """A Llama of zeros whose int4 build takes seconds (quantizing 50 MB): time to signal it mid-write."""
    folder = tmp_path_factory.mktemp("slow")
    hidden, intermediate, layers, vocab, kv = 512, 2048, 2, 8192, 256
    config = dict(architectures=["LlamaForCausalLM"], model_type="llama", vocab_size=vocab, hidden_size=hidden,
                  intermediate_size=intermediate, num_hidden_layers=layers, num_attention_heads=8,
                  num_key_value_heads=4, max_position_embeddings=128, rms_norm_eps=1e-5, rope_theta=10000.0,
                  torch_dtype="float32", tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    (folder / "config.json").write_text(json.dumps(config))
    tensors = {"model.embed_tokens.weight": np.zeros((vocab, hidden), np.float32),
               "lm_head.weight": np.zeros((vocab, hidden), np.float32),
               "model.norm.weight": np.ones(hidden, np.float32)}
    shapes = {"self_attn.q_proj": (hidden, hidden), "self_attn.k_proj": (kv, hidden), "self_attn.v_proj": (kv, hidden),
              "self_attn.o_proj": (hidden, hidden), "mlp.gate_proj": (intermediate, hidden),
              "mlp.up_proj": (intermediate, hidden), "mlp.down_proj": (hidden, intermediate)}
    for i in range(layers):
        for norm in ("input_layernorm", "post_attention_layernorm"):
            tensors[f"model.layers.{i}.{norm}.weight"] = np.ones(hidden, np.float32)
        for name, shape in shapes.items():
            tensors[f"model.layers.{i}.{name}.weight"] = np.zeros(shape, np.float32)
    save_file(tensors, folder / "model.safetensors")
    return add_example_tokenizer(folder)


def signalled_mid_build(source, out, signum):
    """Starts `python -m builder`, and sends `signum` once its staging folder exists."""
    proc = subprocess.Popen([sys.executable, "-m", "builder", "-m", str(source), "-o", str(out), "-q"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=out.parent)
    deadline = time.monotonic() + 120
    while not list(out.parent.glob(f".{out.name}.partial-*")):
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.002)
    proc.send_signal(signum)
    stdout, stderr = proc.communicate(timeout=120)
    return proc.returncode, stdout, stderr


@pytest.mark.usefixtures("signals_as_in_a_terminal")
def test_sigterm_is_an_interruption_that_leaves_nothing(slow_checkpoint, tmp_path):
    out = tmp_path / "parent" / "out"
    out.parent.mkdir()
    result = signalled_mid_build(slow_checkpoint, out, signal.SIGTERM)
    # Compared whole, so that a failure shows stderr (it failed once, exit 1, with nothing to read).
    assert result == (143, "", "error: interrupted; nothing was written\n")
    assert list(out.parent.iterdir()) == []


@pytest.mark.usefixtures("signals_as_in_a_terminal")
def test_a_signal_as_the_staging_folder_is_made_leaves_nothing(tmp_path, capsys, monkeypatch):
    # SIGTERM right after mkdtemp made the folder, before the build named it: it was left behind
    # (test_sigterm_is_an_interruption_that_leaves_nothing failed so now and then on a busy machine).
    import tempfile

    made = tempfile.mkdtemp

    def mkdtemp_then_signalled(*args, **kwargs):
        folder = made(*args, **kwargs)
        signal.raise_signal(signal.SIGTERM)  # to this thread: handled inside this call
        return folder

    monkeypatch.setattr(tempfile, "mkdtemp", mkdtemp_then_signalled)
    out = tmp_path / "parent" / "out"
    out.parent.mkdir()
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32")
    assert rc == 143 and err == "error: interrupted; nothing was written\n"
    assert list(out.parent.iterdir()) == []


@pytest.mark.usefixtures("signals_as_in_a_terminal")
def test_a_signal_inside_the_interpreters_locks_is_still_an_interruption(tmp_path, capsys, monkeypatch):
    # SIGTERM's KeyboardInterrupt, raised while the writer's thread pool re-took a Condition's lock,
    # came out of threading as "RuntimeError: release unlocked lock": exit 1 and a traceback, once in
    # CI (test_sigterm_is_an_interruption_that_leaves_nothing).
    import builder.writer

    def save_one_signalled(*args, **kwargs):
        try:
            signal.raise_signal(signal.SIGTERM)  # to this thread: handled inside this call
            time.sleep(5)
        except KeyboardInterrupt:
            raise RuntimeError("release unlocked lock")  # what threading.Condition.__exit__ raised

    monkeypatch.setattr(builder.writer, "_save_one", save_one_signalled)
    out = tmp_path / "parent" / "out"
    out.parent.mkdir()
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32")
    assert (rc, err) == (143, "error: interrupted; nothing was written\n")
    assert list(out.parent.iterdir()) == []


def test_what_a_killed_build_leaves_is_removed_by_the_next_build(slow_checkpoint, tmp_path, capsys):
    out = tmp_path / "out"
    rc, _, _ = signalled_mid_build(slow_checkpoint, out, signal.SIGKILL)
    assert rc == -signal.SIGKILL
    left = [p for p in tmp_path.iterdir() if p.name.startswith(".out.partial-")]
    assert len(left) == 1 and not out.exists()
    size = sum(f.lstat().st_size for f in left[0].rglob("*") if not f.is_dir())
    rc, err = run(capsys, "-m", EXAMPLE, "-o", tmp_path / "other", "-p", "fp32")
    assert rc == 0, err
    assert f"removed 1 folder that killed builds left in {tmp_path} ({human(size)})" in err.splitlines()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other"]


def test_leftovers_that_are_not_provably_a_builds_are_kept(tmp_path, capsys):
    (tmp_path / "out").mkdir()  # there: the .old-* folder below is not a replaced output to restore
    (tmp_path / "out" / "photo.jpg").write_bytes(b"mine")
    kept = {".out.partial-abcd1234": "notes.txt", ".out.old-abcd1234": "out/notes.txt", ".out.partial-x": "model.onnx",
            ".out.partial-abcd1234.bak": "model.onnx", ".out.old-abcd5678": "elsewhere/model.onnx"}
    for folder, name in kept.items():
        (tmp_path / folder / name).parent.mkdir(parents=True)
        (tmp_path / folder / name).write_text("mine")
    before = snapshot(tmp_path)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", tmp_path / "other", "-q", "-p", "fp32")
    assert rc == 0, err
    after = snapshot(tmp_path)
    assert {k: v for k, v in after.items() if not k.startswith("other")} == before


def test_the_staging_folder_of_a_running_build_is_not_removed(tmp_path, capsys):
    staging = tmp_path / ".out.partial-abcd1234"
    staging.mkdir()
    (staging / "model.onnx.data").write_bytes(b"being written")
    with open(tmp_path / ".out.lock", "w") as lock:  # as a build writing `out` holds it
        fcntl.flock(lock, fcntl.LOCK_EX)
        rc, err = run(capsys, "-m", EXAMPLE, "-o", tmp_path / "other", "-q", "-p", "fp32")
    assert rc == 0, err
    assert (staging / "model.onnx.data").read_bytes() == b"being written"


@pytest.mark.usefixtures("signals_as_in_a_terminal")
def test_a_signal_while_publishing_waits_until_the_output_is_complete(tmp_path, capsys, monkeypatch):
    import builder.publish

    out = build(tmp_path / "out")
    real = builder.publish.exchange

    def signalled_mid_swap(staging, final):
        signal.raise_signal(signal.SIGINT)  # Ctrl-C: held until the swap is done and the old output gone
        return real(staging, final)

    monkeypatch.setattr(builder.publish, "exchange", signalled_mid_swap)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp16", "--overwrite")
    assert rc == 130 and err == f"error: interrupted; {out} was already complete\n"
    assert "precision: fp16" in (out / "build.yaml").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


def test_an_ignored_signal_stays_ignored_while_publishing(tmp_path, capsys, monkeypatch):
    # A Ctrl-C the caller ignores (`builder ... &` in a script) is not turned into one by holding it
    # during the swap: the build completes, and SIGINT is still ignored afterwards.
    import builder.publish

    out = build(tmp_path / "out")
    real = builder.publish.exchange

    def signalled_mid_swap(staging, final):
        signal.raise_signal(signal.SIGINT)
        return real(staging, final)

    monkeypatch.setattr(builder.publish, "exchange", signalled_mid_swap)
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp16", "--overwrite")
        assert signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    finally:
        signal.signal(signal.SIGINT, previous)
    assert (rc, err) == (0, "")
    assert "precision: fp16" in (out / "build.yaml").read_text()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out"]


@pytest.mark.usefixtures("signals_as_in_a_terminal")
def test_a_signal_after_publishing_says_the_output_is_complete(tmp_path, capsys, monkeypatch):
    # Ctrl-C as the lock is released, after the swap: the build had replaced the fp32 output with
    # the fp16 one, yet the message said "interrupted; nothing was written".
    import builder.publish

    out = build(tmp_path / "out")
    real = builder.publish.unlock

    def signalled_unlock(*args):
        real(*args)
        signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(builder.publish, "unlock", signalled_unlock)
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp16", "--overwrite")
    assert (rc, err) == (130, f"error: interrupted; {out} was already complete\n")
    assert "precision: fp16" in (out / "build.yaml").read_text()


@pytest.mark.usefixtures("signals_as_in_a_terminal")
def test_a_signal_while_the_path_is_printed_is_one_line(tmp_path, capsys, monkeypatch):
    # SIGTERM as the finished build's path was printed escaped main(): a traceback and exit 130.
    import builder.cli

    def signalled_say(text):
        signal.raise_signal(signal.SIGTERM)

    monkeypatch.setattr(builder.cli, "_say", signalled_say)
    out = tmp_path / "out"
    rc, err = run(capsys, "-m", EXAMPLE, "-o", out, "-q", "-p", "fp32")
    assert (rc, err) == (143, f"error: interrupted; {out} was already complete\n")
