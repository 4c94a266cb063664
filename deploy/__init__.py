"""The whole deployment as local processes: `trajlake stack up|status|down`."""
