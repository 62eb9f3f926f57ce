"""The AWS CLI and the AWS SDKs' environment for the tests that run them (aws_clients, boto3_jobs)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import pytest

# Nothing from the machine's own AWS set-up: no profile, no credentials, no instance metadata.
AWS_QUIET = {
    "AWS_CONFIG_FILE": os.devnull,
    "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
    "AWS_EC2_METADATA_DISABLED": "true",
    "AWS_DEFAULT_REGION": "us-east-1",
}


def aws_cli() -> str:
    """The venv's `aws` (awscli, a test extra); the test is skipped without it."""
    aws = shutil.which("aws", path=str(Path(sys.executable).parent))
    if aws is None:
        pytest.skip("the AWS CLI (awscli, a test extra) is not installed")
    return aws
