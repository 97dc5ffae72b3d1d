"""A font for the CJK text of the report's figures (a Chinese sentence's attention heat-map): matplotlib's default,
DejaVu Sans, has no CJK glyphs and draws each character as an empty box. An installed font that has the text's
characters is used (Debian's fonts-noto-cjk, WenQuanYi, ...); else Noto Sans SC from a PyPI wheel, downloaded at first
use (cjk_font_file); else the figure is drawn as it is and the report says why its characters are boxes and what
to install."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

from data_prep.corpus.builtin.fetch import pip_download, publish, scratch_dir
from data_prep.corpus.chinese import has_cjk

# Where the machine has no CJK font: Noto Sans SC (Google and Adobe's Source Han Sans, simplified Chinese subset; SIL
# Open Font License 1.1), as shipped in a PyPI wheel, fetched as the built-in data is
# (data_prep/corpus/builtin/fetch.py)
CJK_FONT_PACKAGE = "pylopdf-fonts-zh-cn==0.1.1"
CJK_FONT_MEMBER = "pylopdf_fonts_zh_cn/NotoSansSC-Regular.otf"


@dataclass(frozen=True)
class FontChoice:
    path: Path | None  # None: matplotlib's default font
    note: str  # for the report: which font, or why the characters may not show


def cjk_font_file(cache_dir: str | Path) -> Path:
    """Noto Sans SC's OpenType file, downloaded from PyPI (CJK_FONT_PACKAGE) at first use and cached with its
    PROVENANCE.md; RuntimeError when the registry cannot be reached."""
    import zipfile

    final = Path(cache_dir) / "data" / "cjk_font"
    if not final.is_dir():
        print(f"report: downloading the CJK font of {CJK_FONT_PACKAGE} from PyPI into {final}")
        with scratch_dir(cache_dir) as work:
            wheel = pip_download(CJK_FONT_PACKAGE, Path(work) / "dl")
            out = Path(work) / "out"
            out.mkdir()
            with zipfile.ZipFile(wheel) as zf:
                (out / Path(CJK_FONT_MEMBER).name).write_bytes(zf.read(CJK_FONT_MEMBER))
            (out / "PROVENANCE.md").write_text(
                f"{Path(CJK_FONT_MEMBER).name}: from the PyPI wheel {CJK_FONT_PACKAGE} ({wheel.name}), "
                f"{CJK_FONT_MEMBER}: Noto Sans SC Regular (Google / Adobe, SIL Open Font License 1.1), for the CJK "
                "text of the report's figures.\n")
            publish(out, final)
    return final / Path(CJK_FONT_MEMBER).name


# U+0378 is unassigned in Unicode: only a last-resort font (matplotlib ships LastResortHE) maps it, as it maps every
# code point, to a box that names the character's block; such a font "has" every glyph and shows none
UNASSIGNED_CODE_POINT = 0x0378


@functools.cache
def has_glyphs(path: str, text: str) -> bool:
    """Whether the font file draws every non-space character of `text` (FreeType, through matplotlib): it maps each to
    a glyph and is no last-resort font."""
    from matplotlib.ft2font import FT2Font

    try:
        font = FT2Font(path)
    except (OSError, RuntimeError):
        return False
    if font.get_char_index(UNASSIGNED_CODE_POINT):
        return False
    return all(font.get_char_index(ord(char)) for char in text if not char.isspace())


def installed_font(text: str) -> Path | None:
    """An installed font (matplotlib's list of the system's and its own) with glyphs for all of `text`."""
    from matplotlib import font_manager

    for entry in sorted(font_manager.fontManager.ttflist, key=lambda e: e.fname):
        if has_glyphs(entry.fname, text):
            return Path(entry.fname)
    return None


def font_for(text: str, cache_dir: str | Path) -> FontChoice:
    """The font to draw `text` with: matplotlib's default for text without CJK, else an installed CJK font, else the
    registry's (downloaded once), else the default with a note naming what to install."""
    if not has_cjk(text):
        return FontChoice(None, "")
    found = installed_font(text)
    if found is not None:
        return FontChoice(found, f"CJK text drawn in the installed font {found.name}.")
    try:
        downloaded = cjk_font_file(cache_dir)
    except RuntimeError as err:
        return FontChoice(None, f"No font with CJK glyphs was found, so the figure's Chinese characters are drawn as "
                                f"empty boxes: install one (Debian: apt-get install fonts-noto-cjk) or give the "
                                f"machine access to PyPI, whose Noto Sans SC the report downloads ({err}).")
    if not has_glyphs(str(downloaded), text):
        return FontChoice(downloaded, f"CJK text drawn in {downloaded.name}, which lacks some of its characters "
                                      "(drawn as boxes); install a fuller CJK font (fonts-noto-cjk)")
    return FontChoice(downloaded, f"CJK text drawn in {downloaded.name} (Noto Sans SC, from PyPI).")
