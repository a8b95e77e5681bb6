"""The process group is released cleanly: no DistributedDataParallel (which holds the gloo group) outlives
``destroy_process_group``. One that did was freed only at interpreter shutdown, where gloo's threads abort the
process ("terminate called without an active exception", SIGABRT): the flaky 2-process test under load."""

import gc
import weakref

import pytest
import torch.distributed as dist
from train_helpers import small_config

from attnkit.training import Trainer
from attnkit.training import dist as tdist


@pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(), reason="torch built without gloo")
@pytest.mark.parametrize("fail", [False, True], ids=["finished", "raised"])
def test_no_ddp_outlives_the_process_group(tmp_path, monkeypatch, fail):
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        monkeypatch.setattr(tdist.DistContext, "enabled", property(lambda self: dist.is_initialized()))
        trainer = Trainer(small_config(tmp_path / "run", steps=2, ckpt_every=2), log=lambda *a, **k: None)
        assert trainer.ddp is not None
        alive = weakref.ref(trainer.ddp)
        at_destroy = []
        original = dist.destroy_process_group
        monkeypatch.setattr(dist, "destroy_process_group", lambda *a: (at_destroy.append(alive()), original(*a)))
        if fail:
            monkeypatch.setattr(trainer, "save", lambda: (_ for _ in ()).throw(OSError("disk full")))
        gc.disable()  # as late in a process as it can happen: no collection would rescue a cycle
        try:
            if fail:
                with pytest.raises(OSError, match="disk full"):
                    trainer.run()
            else:
                trainer.run()
        finally:
            gc.enable()
        assert at_destroy == [None], "the DDP wrapper was still alive when the process group was destroyed"
        assert not dist.is_initialized()
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()
