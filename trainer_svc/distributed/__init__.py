"""One training job over several GPUs: data parallel through `torch.distributed` (Gloo).

    group, ranks = launch_group(2, ["0", "1"])        # rank 0 here, rank 1 a child process
    trainer = DataParallelTrainer(Trainer(model, rank_train_config(tc, 2), device), group, tc,
                                  on_close=ranks.stop)
    trainer.step(batch)             # (A, B, T+1): rank r trains rows [r*B/N, (r+1)*B/N)

One process per GPU (rank), each with its own wgpu device and its own copy of the model. Every
step each rank runs the WGSL forward and backward on its shard of the batch; between the
backward and AdamW the gradients are averaged by a bucketed all-reduce (`grad_sync.py`, the
model's `gradient_hook`); then every rank applies the same update to the same weights, so the
weights stay identical (checked by hash at every checkpoint). Rank 0 is the driver: it owns
the data stream, the checkpoints and (in the daemon) the job's lease; the others only compute.

Modules: `group.py` (the process group: rendezvous on loopback, collectives on numpy arrays,
rank failures), `grad_sync.py` (the all-reduce hook), `data_parallel.py` (the driver and the
rank loop: both sides of one protocol), `launch.py` (spawning the rank processes, picking one
adapter per rank), `worker.py` (a rank process's entry point).

PyTorch is needed only here (`pip install 'istanbul[ddp]'`); a job with `gpus: 1` never
imports it.
"""
