"""The rollout side of training: agents, workflows and queue agents produce episodes
(trajectories with rewards); the controller bounds how far they run ahead of training."""
