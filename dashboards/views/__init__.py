"""The dashboard's pages: one module per page, each with `render(ctx)`."""
