"""The bundled executable's entry point: the ``igi-sdk`` command line, frozen.

Run as a script by the frozen interpreter, not imported. The package is first imported with
IGI_SDK_CLIENT_ONLY=1, which keeps llama.cpp unloaded until the bundle has chosen its build
(a CUDA build cannot be loaded on a machine without the driver).
"""

import os
import sys


def _main() -> int:
    client_only = os.environ.get("IGI_SDK_CLIENT_ONLY")
    os.environ["IGI_SDK_CLIENT_ONLY"] = "1"
    from igi_sdk.bundle import frozen

    if frozen.run_image_worker(sys.argv) or frozen.run_body_worker(sys.argv):
        return 0
    frozen.boot(client_only)
    from igi_sdk.cli import main

    return main()


if __name__ == "__main__":
    sys.exit(_main())
