// Apple's models read and write with the shared helpers (Base64, JSON output, hex); every module
// that imports the models sees them too.
@_exported import StoreKeeperSupport
