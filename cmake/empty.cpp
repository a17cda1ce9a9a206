// Placeholder translation unit for a library component that has no sources yet.
