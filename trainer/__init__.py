"""Turnstile's trainer. User code imports from `trainer.api` (the contracts and
`Trainer`); `turnstile serve` never imports this package's DeepSpeed side."""
