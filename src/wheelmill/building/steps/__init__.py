"""The steps of a build, in one registry: for each kind, how it runs, how it describes
itself in the plan, its scope (once for the cell, or once for each recipe), whether it
retries, and what a failed command in it means. The registry's order is the plan's order:
a run of cell steps happens once, a run of recipe steps for every recipe in turn.

Adding a step is one entry here and its functions; the plan lays it out and the pipeline
runs it without knowing its kind. Each entry declares the products (``wheelmill.building.products``)
it needs, makes and reads; a step sees on the board only what its entry declares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

from wheelmill.building.context import Outcome, StepContext, Where
from wheelmill.building.products import (
    BuildEnv,
    BuildKeys,
    Built,
    CheckedEnv,
    Closure,
    CompilerCache,
    CondaLock,
    Fetched,
    Mirrored,
    Published,
    Ready,
    Repaired,
    ShippedAbi,
    Sources,
    Stamped,
    Toolchain,
    WheelRecord,
)
from wheelmill.building.steps import (
    build,
    cache,
    cell,
    channel,
    checks_after,
    container,
    fetch,
    install,
    keys,
    mirror,
    publish,
)
from wheelmill.errors import (
    BuildError,
    ChannelError,
    CheckError,
    EnvError,
    FetchError,
    InstallTestError,
    PrecheckError,
    RepairError,
    WheelmillError,
)
from wheelmill.planning.spec import CellPlan, RecipeSpec, StepKind


@dataclass(frozen=True, kw_only=True)
class CellStep:
    """A step that runs once for the cell."""

    kind: StepKind
    run: Callable[[StepContext], Outcome]
    describe: Callable[[CellPlan], str]
    error: type[WheelmillError]  # what a failed command in it means
    needs: tuple[type, ...] = ()  # products of earlier steps it gets: the cell's, or its own recipe's
    makes: tuple[type, ...] = ()  # products it may make (wheelmill.building.products)
    reads: tuple[type, ...] = ()  # products it looks up where they exist: optional ones, other recipes'
    retries: bool = False  # network-bound: transient failures are tried again
    network: bool = True  # False: its commands run where no network is (a build must not download)
    container: bool = False  # only where the cell has a container
    publishing: bool = False  # only when the wheels are published
    mirroring: bool = False  # only when the closure is mirrored too (not with --no-mirror)
    for_builds: bool = False  # serves the recipes' builds only: not run where every recipe is published
    for_tests: bool = False  # of those, what a reused wheel's install test needs too: run where one is to test


@dataclass(frozen=True, kw_only=True)
class RecipeStep:
    """A step that runs once for each recipe of the cell."""

    kind: StepKind
    run: Callable[[StepContext, RecipeSpec], Outcome]
    describe: Callable[[CellPlan, RecipeSpec], str]
    error: type[WheelmillError]
    needs: tuple[type, ...] = ()  # products of earlier steps it gets: the cell's, or its own recipe's
    makes: tuple[type, ...] = ()  # products it may make (wheelmill.building.products)
    reads: tuple[type, ...] = ()  # products it looks up where they exist: optional ones, other recipes'
    retries: bool = False
    network: bool = True
    publishing: bool = False
    # Runs on a thread beside the steps after it, which wait for it only where they need
    # its outcome: the cell's steps and its recipe's later ones (the pipeline's waits_for).
    beside: bool = False


StepDefinition = CellStep | RecipeStep

# A recipe's build takes the wheels of the recipes it depends on, built before it: each one
# tested (delivered), or repaired while its install test runs beside.
OF_DEPENDENCIES: tuple[type, ...] = (WheelRecord, Repaired)

REGISTRY: tuple[StepDefinition, ...] = (
    # What needs no container is checked first (fail early: before minutes of image
    # building); in a container the toolchain is checked once commands run there.
    CellStep(
        kind=StepKind.PRE_CHECKS,
        makes=(Sources, Toolchain, CondaLock, Where),
        run=cell.pre_checks,
        describe=cell.describe_pre_checks,
        error=PrecheckError,
    ),
    # Nothing is built again that the channel has from the same inputs: decided before the
    # image, the container and the env, which only a build needs (seconds to minutes).
    CellStep(
        kind=StepKind.BUILD_KEYS,
        makes=(BuildKeys,),
        reads=(Toolchain,),
        run=keys.build_keys_step,
        describe=keys.describe,
        error=ChannelError,
    ),
    CellStep(
        kind=StepKind.PREPARE_IMAGE,
        makes=(Ready,),
        run=container.prepare_image,
        describe=container.describe_image,
        error=PrecheckError,
        container=True,
        for_builds=True,
        for_tests=True,
    ),
    CellStep(
        kind=StepKind.PREPARE_CONTAINER,
        needs=(Ready,),
        makes=(Where,),
        run=container.prepare_container,
        describe=container.describe_container,
        error=PrecheckError,
        container=True,
        for_builds=True,
        for_tests=True,
    ),
    CellStep(
        kind=StepKind.TOOLCHAIN_CHECKS,
        makes=(Toolchain,),
        run=cell.toolchain_checks,
        describe=cell.describe_toolchain_checks,
        error=PrecheckError,
        container=True,
        for_builds=True,
        for_tests=True,
    ),
    CellStep(
        kind=StepKind.PREPARE_ENV,
        needs=(Sources, Toolchain),
        makes=(BuildEnv,),
        reads=(CondaLock,),
        run=cell.prepare_env,
        describe=cell.describe_prepare_env,
        error=EnvError,
        retries=True,
        for_builds=True,
        for_tests=True,
    ),
    CellStep(
        kind=StepKind.ENV_CHECKS,
        needs=(BuildEnv, Toolchain),
        makes=(CheckedEnv,),
        run=cell.env_checks,
        describe=cell.describe_env_checks,
        error=PrecheckError,
        for_builds=True,
        for_tests=True,
    ),
    # Where the network is: a remote cache needs it, and the builds reach the server over
    # a Unix socket from where there is none.
    CellStep(
        kind=StepKind.COMPILER_CACHE,
        makes=(CompilerCache,),
        run=cache.compiler_cache,
        describe=cache.describe,
        error=PrecheckError,
        for_builds=True,
    ),
    RecipeStep(
        kind=StepKind.FETCH,
        needs=(Sources,),
        makes=(Fetched,),
        run=fetch.fetch,
        describe=fetch.describe,
        error=FetchError,
        retries=True,
    ),
    # From the build to the repaired wheel nothing needs the network: what a build could
    # download instead of compiling would not be what we built.
    RecipeStep(
        kind=StepKind.BUILD,
        needs=(BuildEnv, CheckedEnv, Fetched, Sources),
        makes=(Built,),
        reads=(CompilerCache, *OF_DEPENDENCIES),
        run=build.build,
        describe=build.describe_build,
        error=BuildError,
        network=False,
    ),
    RecipeStep(
        kind=StepKind.STAMP,
        needs=(Built, CheckedEnv, BuildEnv, BuildKeys, Toolchain),
        makes=(Stamped,),
        reads=(*OF_DEPENDENCIES, Ready),
        run=build.stamp,
        describe=build.describe_stamp,
        error=BuildError,
        network=False,
    ),
    RecipeStep(
        kind=StepKind.POST_BUILD_CHECKS,
        needs=(CheckedEnv, Stamped, Toolchain),
        reads=OF_DEPENDENCIES,
        run=checks_after.post_build_checks,
        describe=checks_after.describe_post_build,
        error=CheckError,
        network=False,
    ),
    RecipeStep(
        kind=StepKind.REPAIR,
        needs=(BuildEnv, BuildKeys, CheckedEnv, Stamped),
        makes=(Repaired,),
        run=checks_after.repair,
        describe=checks_after.describe_repair,
        error=RepairError,
        network=False,
    ),
    RecipeStep(
        kind=StepKind.POST_REPAIR_CHECKS,
        needs=(CheckedEnv, Repaired),
        makes=(ShippedAbi,),
        run=checks_after.post_repair_checks,
        describe=checks_after.describe_post_repair,
        error=CheckError,
        network=False,
    ),
    # Seconds of importing torch, mostly one core's: beside the next recipe's build, which
    # takes the repaired wheel of a recipe it needs (a failed test stops it before delivery).
    RecipeStep(
        kind=StepKind.INSTALL_TEST,
        needs=(BuildEnv, BuildKeys, Fetched, Repaired, ShippedAbi, Sources, Toolchain),
        makes=(WheelRecord,),
        reads=(WheelRecord, Stamped),
        run=install.install_test,
        describe=install.describe,
        error=InstallTestError,
        beside=True,
    ),
    RecipeStep(
        kind=StepKind.PUBLISH,
        needs=(BuildKeys, WheelRecord),
        makes=(Published,),
        run=publish.publish_step,
        describe=publish.describe,
        error=ChannelError,
        publishing=True,
    ),
    # The channel then installs on its own: torch and every dependency beside the wheels.
    # Where every recipe is published already, the run that published them did these.
    CellStep(
        kind=StepKind.CLOSURE,
        needs=(BuildEnv, Sources),
        makes=(Closure,),
        reads=(WheelRecord, Published),
        run=mirror.resolve_closure,
        describe=mirror.describe_closure,
        error=FetchError,
        publishing=True,
        mirroring=True,
        for_builds=True,
    ),
    CellStep(
        kind=StepKind.MIRROR,
        needs=(Sources,),
        makes=(Mirrored,),
        reads=(Closure,),
        run=mirror.mirror_closure,
        describe=mirror.describe_mirror,
        error=FetchError,
        publishing=True,
        mirroring=True,
        for_builds=True,
    ),
    CellStep(
        kind=StepKind.CHANNEL_CHECKS,
        reads=(WheelRecord, Published, Closure),
        run=channel.channel_checks,
        describe=channel.describe,
        error=ChannelError,
        publishing=True,
        for_builds=True,
    ),
)

BY_KIND: Mapping[StepKind, StepDefinition] = {d.kind: d for d in REGISTRY}


def unmet_needs(registry: Sequence[StepDefinition]) -> list[str]:
    """Each need an entry declares that no entry before it makes, in the registry's order
    (the plan's): a cell step's needs are made by cell steps; a recipe step's by cell steps
    or its own recipe's earlier steps."""
    unmet = []
    for at, definition in enumerate(registry):
        made = {product for earlier in registry[:at] for product in earlier.makes}
        for need in definition.needs:
            if need not in made:
                later = [str(d.kind) for d in registry[at + 1 :] if need in d.makes]
                made_by = f"only later by {', '.join(later)}" if later else "by no step"
                unmet.append(f"{definition.kind} needs {need.__name__}, made {made_by}")
    return unmet
