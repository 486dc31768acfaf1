"""Aligned plain-text tables for the command line: numbers right-aligned, text left-aligned."""


def _is_number(s):
    s = s.strip().rstrip("%x").replace(",", "")
    for unit in (" ps", " ns", " us", " ms", " s", " GB/s", " GiB", " MiB", " KiB"):
        if s.endswith(unit):
            s = s[: -len(unit)]
            break
    try:
        float(s)
        return True
    except ValueError:
        return False


def format_table(headers, rows, indent="  ", align=None):
    """Returns the table as a string (no trailing newline). align: per column 'l' or 'r'; by default
    a column is right-aligned when every cell of it reads as a number (units allowed)."""
    cells = [[str(h) for h in headers]] + [[str(c) for c in r] for r in rows]
    ncol = max(len(r) for r in cells)
    for r in cells:
        r.extend([""] * (ncol - len(r)))
    widths = [max(len(r[i]) for r in cells) for i in range(ncol)]
    if align is None:
        align = []
        for i in range(ncol):
            body = [r[i] for r in cells[1:] if r[i] != ""]
            align.append("r" if body and all(_is_number(c) for c in body) else "l")
    lines = []
    for k, r in enumerate(cells):
        parts = [c.rjust(widths[i]) if align[i] == "r" else c.ljust(widths[i]) for i, c in enumerate(r)]
        lines.append((indent + "  ".join(parts)).rstrip())
        if k == 0:
            lines.append(indent + "  ".join("-" * w for w in widths))
    return "\n".join(lines)
