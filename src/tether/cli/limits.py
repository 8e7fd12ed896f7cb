"""`tether limits`: accounts' budgets and endpoints' rates in a store, set and read
(`accounts.py` and `rates.py` say how they hold). It opens the store's ledger only: setting a
limit starts no runs and needs no worker.

    tether limits                                   every account and rated endpoint
    tether limits acme                              one account
    tether limits set acme --cost-per-day 20 --tokens-total 5000000 [--when-over queue]
    tether limits clear acme                        its limits removed (its spend is kept)
    tether limits rate --provider openai-chat --requests 500 --tokens 200000 [--per 60]
    tether limits rate clear --base-url http://127.0.0.1:8000/v1
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING

import orjson

from ..accounts import PERIODS, Limits, Standing, check_account
from ..errors import ConfigError, MissingAPIKey, TetherError
from ..rates import Rate, RateStanding, endpoint_of
from .common import error

if TYPE_CHECKING:  # not subscriptable at run time
    Subparsers = argparse._SubParsersAction[argparse.ArgumentParser]

AMOUNTS = (
    ("cost_per_day", float, "USD"),
    ("cost_per_month", float, "USD"),
    ("cost_total", float, "USD"),
    ("tokens_per_day", int, "N"),
    ("tokens_per_month", int, "N"),
    ("tokens_total", int, "N"),
)


def limits_command(sub: Subparsers) -> argparse.ArgumentParser:
    p = sub.add_parser(
        "limits",
        help="accounts' budgets and endpoints' rate limits, held across every worker",
        description="Set and read accounts' limits (cost and tokens, per day and month in UTC, "
        "and in total). A run names its account with --account; before each model call it "
        "reserves the call's estimate against the account, across every process of the "
        "store, and halts (exit 3, 'account budget: ...') when a limit is reached. A new run "
        "of an account over a limit is refused (exit 3), or with --when-over queue started "
        "and held before its first call until there is room. A limit set below what was "
        "spent already holds from the next call. 'tether limits rate' sets the requests and "
        "tokens an endpoint and key may take in a period, across every process of the store.",
    )
    p.add_argument(
        "words",
        nargs="*",
        metavar="[set|clear] ACCOUNT",
        help="nothing: every account; ACCOUNT: one; set ACCOUNT: set its limits (those not "
        "given are removed); clear ACCOUNT: remove them",
    )
    for name, kind, unit in AMOUNTS:
        p.add_argument(f"--{name.replace('_', '-')}", type=kind, metavar=unit)
    p.add_argument(
        "--when-over",
        choices=("refuse", "queue"),
        default="refuse",
        help="what a new run of an account over a limit meets (default: refuse)",
    )
    rate = p.add_argument_group(
        "rates (tether limits rate [clear] ...): requests and tokens an endpoint and key takes, "
        "across every worker of the store; each HTTP attempt waits for room"
    )
    rate.add_argument("--requests", type=int, metavar="N", help="attempts in each period")
    rate.add_argument("--tokens", type=int, metavar="N", help="tokens in each period (estimated)")
    rate.add_argument(
        "--per", type=float, default=60.0, metavar="SECONDS", help="the period (default: 60)"
    )
    rate.add_argument("--provider", help="the endpoint's wire protocol, as tether run takes it")
    rate.add_argument("--base-url", help="the endpoint's URL (default: the provider's)")
    rate.add_argument("--model", help="a model name, where it decides the provider")
    rate.add_argument("--endpoint", help="an endpoint as tether limits lists it")
    return p


def command_limits(args: argparse.Namespace) -> int:
    """`tether limits ...`: its exit status."""
    from ..durable.accounts import StoredAccounts
    from ..durable.ledger import Ledger
    from ..durable.rates import StoredRates

    words = list(args.words)
    if words[:1] == ["rate"]:
        return command_rate(args, words[1:])
    try:
        given = {name: getattr(args, name) for name, _, _ in AMOUNTS}
        for name, value in given.items():
            if value is not None and not (math.isfinite(value) and value >= 0):
                option = "--" + name.replace("_", "-")
                raise ConfigError(f"{option} must be a number of 0 or more, not {value}")
        if words[:1] == ["set"] and len(words) == 2:
            limits = Limits(**given, when_over=args.when_over)
            if not any(v is not None for v in given.values()):
                raise ConfigError("limits set: give at least one limit (see tether limits -h)")
        elif any(v is not None for v in given.values()):
            raise ConfigError("limits are given with: tether limits set ACCOUNT --cost-per-day ...")
        if len(words) > 2 or (len(words) == 2 and words[0] not in ("set", "clear")):
            raise ConfigError("usage: tether limits [ACCOUNT | set ACCOUNT ... | clear ACCOUNT]")
        ledger = Ledger(args.store, connections=1)
        accounts = StoredAccounts(ledger)
        if not words:
            found = [accounts.standing_now(a) for a in accounts.names_now()]
            rated = StoredRates(ledger).rates_now()
        elif len(words) == 1:
            one = accounts.standing_now(check_account(words[0]))
            if one.limits is None and not any(c.tokens or c.usd for c in one.spent.values()):
                raise ConfigError(f"account {words[0]} has no limits and has spent nothing")
            found = [one]
        else:
            account = check_account(words[1])
            accounts.set_now(account, limits if words[0] == "set" else None)
            found = [accounts.standing_now(account)]
    except ConfigError as e:
        return error(str(e))
    for standing in found:
        print(orjson.dumps(standing.to_dict()).decode() if args.json else described(standing))
    if not found and not args.json:
        print("no account has limits or spend in this store")
    if not words:
        show_rates(rated, args.json)
    return 0


def described(s: Standing) -> str:
    """One account in a few lines: each period's spend, held and limits."""
    lines = [s.account + ("" if s.limits is not None else " (no limits)")]
    for period in PERIODS:
        spent, held = s.spent[period], s.held[period]
        row = f"  {period:<6} ${spent.usd:.4f}, {spent.tokens} tokens"
        if held.usd or held.tokens:
            row += f" (+${held.usd:.4f}, {held.tokens} tokens in flight)"
        bounds = [
            f"${value:g}" if what == "cost" else f"{int(value)} tokens"
            for p, what, value in (s.limits.bounds() if s.limits is not None else [])
            if p == period
        ]
        lines.append(row + (f"   limit {', '.join(bounds)}" if bounds else ""))
    if s.limits is not None:
        lines.append(f"  a new run over a limit: {s.limits.when_over}d")
    refused = s.refusal()
    if refused:
        lines.append(f"  over: {refused}")
    return "\n".join(lines)


def command_rate(args: argparse.Namespace, words: list[str]) -> int:
    """`tether limits rate [clear] ENDPOINT-OPTIONS [--requests N] [--tokens N] [--per S]`:
    set an endpoint's rate, clear it, or (with no amounts) show it."""
    from ..durable.ledger import Ledger
    from ..durable.rates import StoredRates

    amounts = args.requests is not None or args.tokens is not None
    try:
        if words not in ([], ["clear"]):
            raise ConfigError("usage: tether limits rate [clear] --provider P [--base-url URL] ...")
        if words and amounts:
            raise ConfigError("limits rate clear takes no --requests or --tokens")
        endpoint = named_endpoint(args)
        rate = Rate(args.requests, args.tokens, args.per) if amounts else None
        rates = StoredRates(Ledger(args.store, connections=1))
        if words or amounts:
            rates.set_now(endpoint, rate)
        found = [r for r in rates.rates_now() if r.endpoint == endpoint]
    except TetherError as e:
        return error(str(e))
    if not found and not args.json:
        print(f"{endpoint}: no rate")
    show_rates(found, args.json)
    return 0


def named_endpoint(args: argparse.Namespace) -> str:
    """The endpoint and key the options name: as a run with them would reach it (its key from
    the same environment variables), or `--endpoint` as listed."""
    from ..options import RunOptions, default_provider
    from ..providers import make_model

    if args.endpoint is not None:
        if args.provider or args.base_url or args.model:
            raise ConfigError("--endpoint names an endpoint alone: no --provider or --base-url")
        return endpoint_of(args.endpoint)
    if not (args.provider or args.base_url or args.model):
        raise ConfigError("name the endpoint: --provider, --base-url or --model (or --endpoint)")
    options = RunOptions(provider=args.provider, model=args.model, base_url=args.base_url)
    provider = args.provider or default_provider(options)
    try:
        return endpoint_of(make_model(provider, args.model, base_url=args.base_url))
    except MissingAPIKey as e:  # a rate is a key's: its hash names the endpoint
        raise ConfigError(
            f"{e.variable} is not set: a rate is for an endpoint and key, so export the key "
            "the runs use (or name the endpoint with --endpoint, as tether limits lists it)"
        ) from None


def show_rates(found: list[RateStanding], json: bool) -> None:
    for r in found:
        print(orjson.dumps(r.to_dict()).decode() if json else described_rate(r))


def described_rate(r: RateStanding) -> str:
    """An endpoint in two lines: its rate, and its attempts in the last window."""
    head = f"{r.endpoint}: {r.rate.said() if r.rate is not None else 'no rate'}"
    per = f"{r.rate.per:g} s" if r.rate is not None else "window"
    line = f"  last {per}: {r.requests} requests, {r.tokens} tokens (estimated)"
    if r.paused_for > 0:
        line += f"; paused {r.paused_for:.1f} s more, as a server asked"
    return head + "\n" + line
