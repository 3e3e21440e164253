"""Training metrics to TensorBoard event files and to metrics.jsonl, one JSON object per line, in the workdir."""

import json
import os

import tensorboardX


class MetricWriter:
  """Writes scalars under '<split>/<name>'. On resume, JSONL lines past the resumed step (written after the last
  checkpoint by a run that stopped) are dropped, since those steps are trained again."""

  def __init__(self, workdir: str, resume_step: int = 0):
    os.makedirs(workdir, exist_ok=True)
    self.jsonl = os.path.join(workdir, "metrics.jsonl")
    if os.path.exists(self.jsonl):
      with open(self.jsonl) as f:
        kept = [line for line in f if line.strip() and json.loads(line)["step"] <= resume_step]
      with open(self.jsonl, "w") as f:
        f.writelines(kept)
    self.tb = tensorboardX.SummaryWriter(os.path.join(workdir, "tensorboard"), purge_step=resume_step or None)

  def write(self, split: str, step: int, scalars: dict) -> None:
    for name, value in scalars.items():
      self.tb.add_scalar(f"{split}/{name}", value, step)
    self.tb.flush()
    with open(self.jsonl, "a") as f:
      f.write(json.dumps(dict(step=step, split=split, **scalars)) + "\n")

  def write_config(self, config) -> None:
    self.tb.add_text("config", "```\n" + str(config) + "\n```", 0)

  def close(self) -> None:
    self.tb.close()
