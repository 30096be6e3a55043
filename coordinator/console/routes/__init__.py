"""The console's pages and actions, one module per page; ``common`` holds the wrappers that
make every page require sign-in and every action pass the CSRF check."""
