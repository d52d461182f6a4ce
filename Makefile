# `sam build --build-in-source` (BuildMethod: makefile) calls one target per
# function. The first runs ONE cargo-lambda build of all three functions (one
# dependency graph, features unified, every crate compiled once); the other
# two find it done. Each target then copies its function's bootstrap.
#
#   HOOKLEDGER_BUILD_PROFILE   release (default) or debug
#   HOOKLEDGER_LAMBDA_ARCH     x86_64 (default) or arm64 (needs that Rust target)
#   HOOKLEDGER_BUILD_WITH      cargo-lambda (default: what a deploy uses), or host:
#                              the test suite's debug `cargo build` for this x86_64 Linux
#                              host, which finds target/debug already built (scripts/check-template
#                              uses it to check the template and its build wiring quickly)
HOOKLEDGER_BUILD_PROFILE ?= release
HOOKLEDGER_LAMBDA_ARCH ?= x86_64
HOOKLEDGER_BUILD_WITH ?= cargo-lambda
LAMBDA_DIR := $(CURDIR)/.local/lambda/$(HOOKLEDGER_LAMBDA_ARCH)-$(HOOKLEDGER_BUILD_PROFILE)

BUILD_FLAGS := --locked -p intake -p processor -p reconciler --lambda-dir $(LAMBDA_DIR)
ifeq ($(HOOKLEDGER_BUILD_PROFILE),release)
BUILD_FLAGS += --release
endif
ifeq ($(HOOKLEDGER_LAMBDA_ARCH),arm64)
BUILD_FLAGS += --arm64
endif

.PHONY: functions build-IntakeFunction build-ProcessorFunction build-ReconcilerFunction

ifeq ($(HOOKLEDGER_BUILD_WITH),host)
LAMBDA_DIR := $(CURDIR)/.local/lambda/host-debug
# The test suite's own build command: the same packages and targets, hence
# the same features, so what that build made is found fresh (a narrower
# selection would unify other features and rebuild the SDK crates).
functions:
	cargo build --workspace --all-targets --locked
	for fn in intake processor reconciler; do \
	  mkdir -p $(LAMBDA_DIR)/$$fn && cp $(CURDIR)/target/debug/$$fn $(LAMBDA_DIR)/$$fn/bootstrap; \
	done
else
functions:
	cargo lambda build $(BUILD_FLAGS)
endif

build-IntakeFunction: functions
	cp $(LAMBDA_DIR)/intake/bootstrap $(ARTIFACTS_DIR)/bootstrap

build-ProcessorFunction: functions
	cp $(LAMBDA_DIR)/processor/bootstrap $(ARTIFACTS_DIR)/bootstrap

build-ReconcilerFunction: functions
	cp $(LAMBDA_DIR)/reconciler/bootstrap $(ARTIFACTS_DIR)/bootstrap
