"""`python -m tokenizer_svc --vocab V --port P`: the gRPC tokenizer service (`istanbul serve`)."""

from .cli_serve import main

raise SystemExit(main())
