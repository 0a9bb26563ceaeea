import sys

from tests.llamacpp_server.suite import main

sys.exit(main())
