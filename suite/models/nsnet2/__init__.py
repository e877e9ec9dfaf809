"""NSNet2-style noise suppression (Braun, Gamper, Reddy & Tashev, "Towards efficient models for
real-time deep noise suppression", arXiv:2101.09249), from code.

The noisy waveform is transformed by a short-time Fourier transform (``torch.stft``, 512 points,
hop 128, periodic Hann window); the network reads log-power features and predicts a magnitude
mask in [0, 1]: fully connected, two GRU layers, two fully connected layers, sigmoid. The masked
magnitude takes the noisy phase back (``torch.angle``, ``torch.polar``) and ``torch.istft``
returns the enhanced waveform.

Training is end to end on the waveform: the enhanced and the clean signal are transformed again
and compared with the compressed spectral loss of Braun & Tashev ("A consolidated view of loss
functions for supervised deep learning-based speech enhancement", arXiv:2009.12286): magnitudes
raised to 0.3, 0.3 x complex MSE + 0.7 x magnitude MSE.

Data: the clean signal is a sum of harmonic partials under a syllable-rate envelope (a crude
voiced-speech stand-in), the noise white plus a low hum, mixed at a random SNR of 0 to 20 dB.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from suite.model import BenchmarkModel

SAMPLE_RATE = 16000
COMPRESSION = 0.3
COMPLEX_WEIGHT = 0.3


def spectrogram(wave: torch.Tensor, n_fft: int, hop: int, window: torch.Tensor) -> torch.Tensor:
    """Complex STFT (B, n_fft // 2 + 1, frames) of a (B, samples) waveform, centred frames."""
    return torch.stft(wave, n_fft, hop, window=window, return_complex=True)


class NSNet2(nn.Module):
    def __init__(self, n_fft: int, hop: int, hidden: int, fc: int) -> None:
        super().__init__()
        self.n_fft, self.hop = n_fft, hop
        bins = n_fft // 2 + 1
        self.register_buffer("window", torch.hann_window(n_fft), persistent=False)
        self.fc_in = nn.Sequential(nn.Linear(bins, hidden), nn.ReLU())
        self.gru = nn.GRU(hidden, hidden, num_layers=2, batch_first=True)
        self.fc_out = nn.Sequential(
            nn.Linear(hidden, fc),
            nn.ReLU(),
            nn.Linear(fc, fc),
            nn.ReLU(),
            nn.Linear(fc, bins),
            nn.Sigmoid(),
        )

    def stft(self, wave: torch.Tensor) -> torch.Tensor:
        """Complex spectrogram (B, F, T) of a (B, samples) waveform."""
        return spectrogram(wave, self.n_fft, self.hop, self.get_buffer("window"))

    def forward(self, noisy: torch.Tensor) -> torch.Tensor:
        """Enhanced waveform (B, samples) of the noisy waveform (B, samples)."""
        spec = self.stft(noisy)
        magnitude = spec.abs()
        features = torch.log10(magnitude.pow(2) + 1e-8).transpose(1, 2)  # (B, T, F)
        h, _ = self.gru(self.fc_in(features))
        mask = self.fc_out(h).transpose(1, 2)
        enhanced = torch.polar(magnitude * mask, torch.angle(spec))
        return torch.istft(
            enhanced, self.n_fft, self.hop, window=self.get_buffer("window"), length=noisy.shape[-1]
        )


def compressed_spectral_loss(estimate: torch.Tensor, clean: torch.Tensor) -> torch.Tensor:
    """Braun & Tashev's loss of two complex spectrograms (B, F, T): a scalar."""
    mag_e = estimate.abs().clamp(min=1e-8)
    mag_c = clean.abs().clamp(min=1e-8)
    comp_e, comp_c = mag_e.pow(COMPRESSION), mag_c.pow(COMPRESSION)
    complex_e = torch.view_as_real(comp_e * estimate / mag_e)
    complex_c = torch.view_as_real(comp_c * clean / mag_c)
    complex_mse = (complex_e - complex_c).pow(2).sum(-1).mean()
    magnitude_mse = (comp_e - comp_c).pow(2).mean()
    return COMPLEX_WEIGHT * complex_mse + (1 - COMPLEX_WEIGHT) * magnitude_mse


def synthetic_mixture(batch: int, samples: int, device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """(noisy, clean) waveforms (batch, samples) at 16 kHz, SNR uniform in [0, 20] dB."""
    t = torch.arange(samples, device=device) / SAMPLE_RATE
    f0 = torch.empty(batch, 1, 1, device=device).uniform_(90, 250)
    harmonics = torch.arange(1, 11, device=device).view(1, -1, 1)
    phases = torch.rand(batch, 10, 1, device=device) * 2 * math.pi
    voiced = (torch.sin(2 * math.pi * f0 * harmonics * t + phases) / harmonics).sum(1)
    envelope = torch.sin(math.pi * 4 * t + torch.rand(batch, 1, device=device) * math.pi).abs()
    clean = voiced * envelope
    noise = torch.randn(batch, samples, device=device) + 0.5 * torch.sin(2 * math.pi * 50 * t)
    snr_db = torch.empty(batch, 1, device=device).uniform_(0, 20)
    gain = clean.pow(2).mean(1, keepdim=True).sqrt() / noise.pow(2).mean(1, keepdim=True).sqrt()
    noisy = clean + noise * gain * torch.pow(10.0, -snr_db / 20)
    return noisy, clean


class Model(BenchmarkModel):
    def __init__(self, test: str, device: str, batch_size: int | None = None) -> None:
        super().__init__(test, device, batch_size)
        samples = int(self.setting("samples", device, 8000))
        self.n_fft = int(self.setting("n_fft", device, 512))
        self.hop = int(self.setting("hop_length", device, 128))
        self.model = NSNet2(
            self.n_fft,
            self.hop,
            int(self.setting("hidden_size", device, 400)),
            int(self.setting("fc_size", device, 600)),
        ).to(device)
        self.window = torch.hann_window(self.n_fft, device=device)
        noisy, self.clean = synthetic_mixture(self.batch_size, samples, device)
        self.example_inputs = (noisy,)
        if test == "train":
            self.model.train()
            self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-4)
        else:
            self.model.eval()

    def train(self) -> None:
        assert self.optimizer is not None
        self.optimizer.zero_grad(set_to_none=True)
        enhanced = self.model(*self.example_inputs)
        loss = compressed_spectral_loss(
            spectrogram(enhanced, self.n_fft, self.hop, self.window),
            spectrogram(self.clean, self.n_fft, self.hop, self.window),
        )
        loss.backward()
        self.optimizer.step()

    def eval(self) -> tuple[torch.Tensor]:
        with torch.no_grad():
            return (self.model(*self.example_inputs),)
