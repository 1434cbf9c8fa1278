"""Acceptance of `paraplan compare`: the README's example (llama3-8b on 8xh100, global batch
256, seq 8192) writes a report whose HTML page, opened in headless Chromium, renders every plot
(each image decodes, and its region of a screenshot is not blank) and whose table, as the
browser parsed it, equals the plan JSONs. Skipped without /usr/bin/chromium."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from paraplan.cli import main as paraplan_main
from paraplan.report.render import COLUMNS

from .test_report import check_table_against_plans, table_cells

pytest.importorskip("matplotlib")

CHROMIUM = "/usr/bin/chromium"
WINDOW_WIDTH_PX = 1280
MAX_PAGE_HEIGHT_PX = 16_000
FIGURES = ("memory", "time", "gantt", "tradeoff", "schedule-compare")
MIN_PIXEL_STD = 0.05
"""A plot's screenshot region has pixel values (0..1) spread at least this much: not blank."""
MIN_INK_SHARE = 0.02
"""...and at least this share of its pixels is not background white."""

# Records, after the page has loaded, each image's decoded size and where it lies on the page,
# and the page's height (the screenshot is taken at that height).
PROBE = """<script>
window.addEventListener('load', () => {
  const images = [...document.images].map((img) => {
    const r = img.getBoundingClientRect();
    return {figure: img.dataset.figure, complete: img.complete, natural_width: img.naturalWidth,
            natural_height: img.naturalHeight, x: r.left + window.scrollX,
            y: r.top + window.scrollY, width: r.width, height: r.height};
  });
  const out = document.createElement('pre');
  out.id = 'probe';
  out.textContent = JSON.stringify({images, height: document.documentElement.scrollHeight});
  document.body.appendChild(out);
});
</script>"""


@pytest.fixture(scope="module")
def readme_report(tmp_path_factory) -> Path:
    """`paraplan compare` on the README's example, as a user runs it (default model source)."""
    folder = tmp_path_factory.mktemp("compare") / "report"
    code = paraplan_main(
        [
            "compare",
            "--model",
            "llama3-8b",
            "--cluster",
            "8xh100",
            "--global-batch",
            "256",
            "--seq-len",
            "8192",
            "-o",
            str(folder),
            "--no-progress",
        ]
    )
    assert code == 0
    return folder


def _chromium(url: str, profile_dir: Path, height_px: int, *mode: str) -> str:
    """Run headless Chromium on `url` in one of its one-shot modes; returns its stdout."""
    cmd = [
        CHROMIUM,
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        f"--user-data-dir={profile_dir}",
        "--hide-scrollbars",
        "--force-device-scale-factor=1",
        f"--window-size={WINDOW_WIDTH_PX},{height_px}",
        "--virtual-time-budget=10000",
        *mode,
        url,
    ]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout


def test_report_folder(readme_report: Path) -> None:
    plans = sorted(p.name for p in (readme_report / "plans").iterdir())
    assert plans == [
        "dp-recompute.json",
        "fsdp.json",
        "megatron.json",
        "plan.json",
        "runner-up-1.json",
        "runner-up-2.json",
        "runner-up-3.json",
    ]
    for key in FIGURES:
        assert (readme_report / "figures" / f"{key}.png").stat().st_size > 10_000
        assert (readme_report / "figures" / f"{key}.svg").stat().st_size > 10_000
    html = (readme_report / "report.html").read_text()
    assert "<script" not in html and 'src="data:image/png;base64,' in html  # self-contained
    assert html.count("<img ") == len(FIGURES)


@pytest.mark.skipif(not Path(CHROMIUM).exists(), reason=f"{CHROMIUM} is not installed")
def test_chromium_renders_every_plot_and_the_table(readme_report: Path, tmp_path: Path) -> None:
    from matplotlib.image import imread

    probe = tmp_path / "probe.html"
    html = (readme_report / "report.html").read_text()
    probe.write_text(html.replace("</body>", PROBE + "</body>"))
    dom = _chromium(probe.as_uri(), tmp_path / "profile-dom", 1000, "--dump-dom")
    start = dom.index('<pre id="probe">') + len('<pre id="probe">')
    found = json.loads(dom[start : dom.index("</pre>", start)].replace("&quot;", '"'))
    images = found["images"]
    assert [img["figure"] for img in images] == list(FIGURES)
    for img in images:  # decoded, and laid out at a visible size
        assert img["complete"] and img["natural_width"] > 800 and img["natural_height"] > 300
        assert img["width"] > 600 and img["height"] > 250, img

    # The table as the browser parsed it equals the plan JSONs.
    cells = table_cells(dom)
    assert check_table_against_plans(cells, readme_report) == {
        p.stem for p in (readme_report / "plans").iterdir()
    }
    assert len(cells) == 7 * len(COLUMNS)

    # A screenshot of the whole page: each plot's region is drawn, not blank.
    height = min(int(found["height"]) + 20, MAX_PAGE_HEIGHT_PX)
    shot = tmp_path / "page.png"
    _chromium(
        (readme_report / "report.html").as_uri(),
        tmp_path / "profile-shot",
        height,
        f"--screenshot={shot}",
    )
    pixels = imread(shot)[..., :3]
    assert pixels.shape[1] == WINDOW_WIDTH_PX and pixels.shape[0] >= found["height"]
    for img in images:
        x0, y0 = int(img["x"]) + 2, int(img["y"]) + 2
        x1, y1 = int(img["x"] + img["width"]) - 2, int(img["y"] + img["height"]) - 2
        region = pixels[y0:y1, x0:x1]
        assert region.size > 0, img
        ink = (region.min(axis=2) < 0.9).mean()
        assert region.std() > MIN_PIXEL_STD and ink > MIN_INK_SHARE, (img["figure"], ink)
    shutil.rmtree(tmp_path / "profile-dom", ignore_errors=True)
    shutil.rmtree(tmp_path / "profile-shot", ignore_errors=True)
