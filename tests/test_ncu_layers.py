"""benchmarks/ncu_layers.py where ncu cannot record: it says why, and in a folder named for its results, its log
keeps that reason (what the GPU suite's headline reads into summary.txt)."""
import pytest
import torch

from benchmarks import ncu_layers


def test_on_an_h200_ncu_is_not_started_and_the_log_says_why(tmp_path, monkeypatch, capsys):
    """The H200 machines' ncu fails to start its profiler: the tool starts nothing there, ends with status 0, and
    its log in --out_dir names the device and the reason (no ncu is run: none is on this machine either)."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    monkeypatch.setattr(ncu_layers, "find_ncu", lambda: "/opt/nvidia/nsight-compute/2025.3.1/ncu")
    monkeypatch.setattr(ncu_layers, "run", lambda *args, **kwargs: pytest.fail("ncu was started"))
    assert ncu_layers.main(["--out_dir", str(tmp_path), "--channels_last"]) == 0
    log = (tmp_path / "ncu_layers.log").read_text()
    assert log.startswith("ncu_layers: not run: NVIDIA H200: ") and "--force" in log
    assert "ncu_layers: not run: NVIDIA H200: " in capsys.readouterr().out
    assert sorted(path.name for path in tmp_path.iterdir()) == ["ncu_layers.log"]
    # An H100 or a GH200 is started; without a GPU the log says there is none, and a second run needs --overwrite.
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert ncu_layers.why_not("/usr/local/cuda/bin/ncu", force=False) is None
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA GH200 480GB")  # not an H200
    assert ncu_layers.why_not("/usr/local/cuda/bin/ncu", force=False) is None
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ncu_layers.main(["--out_dir", str(tmp_path), "--overwrite"]) == 0
    assert (tmp_path / "ncu_layers.log").read_text() == "ncu_layers: not run: no CUDA GPU: ncu records a GPU's kernels\n"


def test_without_an_output_folder_a_machine_without_ncu_is_told_so_and_nothing_is_written(tmp_path, monkeypatch,
                                                                                              capsys):
    monkeypatch.setattr(ncu_layers, "user_folder", lambda name: str(tmp_path / name))
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert ncu_layers.main([]) == 0
    assert "ncu_layers: not run: no CUDA GPU" in capsys.readouterr().out and not (tmp_path / "ncu_layers").exists()



def test_a_report_whose_table_export_runs_out_of_time_is_kept_and_the_export_command_given(tmp_path, monkeypatch,
                                                                                              capsys):
    """ncu's run writes its .ncu-rep; the CSV export after it has its own limit (--export_timeout, under the GPU
    suite's cap for the step). Past it, the report stays, no partial CSV does, and the tool says how to export
    the table later. The stand-in ncu writes the report its --export names and hangs on --import."""
    ncu = tmp_path / "ncu"
    ncu.write_text('#!/bin/sh\ncase " $* " in *" --import "*) exec sleep 30;; esac\n'
                   'while [ "$1" != --export ]; do shift; done; echo report > "$2.ncu-rep"\n')
    ncu.chmod(0o755)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(ncu_layers, "find_ncu", lambda: str(ncu))
    out = tmp_path / "out"
    assert ncu_layers.main(["--out_dir", str(out), "--timeout", "20", "--export_timeout", "1"]) == 1
    said = capsys.readouterr().out
    assert "ncu ended (exit status 0)" in said
    assert "its table was not exported (timed out after 1 s); export it later with: ncu --import " in said
    assert sorted(path.name for path in out.iterdir()) == ["ncu_layers.log", "ncu_layers.ncu-rep"]
    assert " --import " in (out / "ncu_layers.log").read_text()
    # An export in time: the table is written beside the report.
    ncu.write_text('#!/bin/sh\ncase " $* " in *" --import "*) echo \'"Kernel Name","Duration"\'; exit 0;; esac\n'
                   'while [ "$1" != --export ]; do shift; done; echo report > "$2.ncu-rep"\n')
    assert ncu_layers.main(["--out_dir", str(out), "--overwrite", "--export_timeout", "20"]) == 0
    assert (out / "ncu_layers.csv").read_text() == '"Kernel Name","Duration"\n'
